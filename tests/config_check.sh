#!/usr/bin/env bash
# The shipped sample config as a user instance uses it, and config errors from tandemd itself:
# usage: config_check.sh TANDEMD SAMPLE_CONF MODEL
set -euo pipefail
tandemd="$1" sample="$2" model="$3"
tmp="$(mktemp -d)"
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT

# A bad entry: `FILE:LINE: key: problem` and exit code 2, before anything starts.
bad() {
  local want="$1" rc=0 err
  err="$("$tandemd" --config "$tmp/bad.conf" 2>&1 >/dev/null)" || rc=$?
  [ "$rc" = 2 ] || { echo "exit $rc, not 2, for: $err"; exit 1; }
  grep -qF -- "$tmp/bad.conf:$want" <<<"$err" || { echo "expected '$tmp/bad.conf:$want', got: $err"; exit 1; }
}
printf 'model = %s\nsocket_group = no-such-group-tandem\n' "$model" >"$tmp/bad.conf"
bad "2: socket_group: no group 'no-such-group-tandem'"
printf 'model = %s\n\nallowed_groups = no-such-group-tandem\n' "$model" >"$tmp/bad.conf"
bad "3: allowed_groups: no group 'no-such-group-tandem'"
printf 'model = %s\nallowed_users = no-such-user-tandem\n' "$model" >"$tmp/bad.conf"
bad "2: allowed_users: no user 'no-such-user-tandem'"
printf 'kv_cache_mb = lots\n' >"$tmp/bad.conf"
bad "1: kv_cache_mb: expected an integer"
echo "config errors: FILE:LINE: key: problem, exit 2"

# The user unit's start: the sample with only `model` set (quoted, as people write it),
# --socket %t/tandem/tandem.sock and RUNTIME_DIRECTORY=%t/tandem, as a user without the tandem
# group or /run/tandem would have them. (As shipped it sets nothing: the installed demo model.)
[ "$(grep -c '^[a-z_]* =' "$sample")" = 0 ] || { echo "the sample sets a key:"; grep '^[a-z_]* =' "$sample"; exit 1; }
mkdir -p "$tmp/run/tandem" "$tmp/config/tandem"
sed "s|^#model = .*|model = \"$model\"|" "$sample" >"$tmp/config/tandem/tandemd.conf"
[ "$(grep -c '^[a-z_]* =' "$tmp/config/tandem/tandemd.conf")" = 1 ] || { echo "the sample has no one #model line"; exit 1; }
sock="$tmp/run/tandem/tandem.sock"
XDG_RUNTIME_DIR="$tmp/run" RUNTIME_DIRECTORY="$tmp/run/tandem" TANDEM_LOG=warn \
  "$tandemd" --config "$tmp/config/tandem/tandemd.conf" --socket "$sock" --threads 1 2>"$tmp/log" &
pid=$!
for _ in $(seq 100); do
  if [ -S "$sock" ] && curl -sf --unix-socket "$sock" http://x/health >/dev/null 2>&1; then break; fi
  kill -0 "$pid" 2>/dev/null || { echo "tandemd ended on the sample config:"; cat "$tmp/log"; exit 1; }
  sleep 0.2
done
out="$(curl -sf --unix-socket "$sock" http://x/v1/completions -H 'Content-Type: application/json' \
  -d '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}')" \
  || { echo "no completion from the sample config's daemon:"; cat "$tmp/log"; exit 1; }
grep -q '"choices"' <<<"$out" || { echo "unexpected reply: $out"; exit 1; }
pools=("$tmp"/run/tandem/tandem-kv-*)
[ -e "${pools[0]}" ] || { echo "the KV pool is not in RUNTIME_DIRECTORY:"; ls -la "$tmp/run/tandem"; exit 1; }
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || { echo "tandemd exited $rc on SIGTERM:"; cat "$tmp/log"; exit 1; }
[ ! -e "${pools[0]}" ] || { echo "the KV pool outlived the daemon (kv_pool_persist is off by default)"; exit 1; }
echo "user instance from the shipped sample: served a completion"
