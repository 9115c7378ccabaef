#!/usr/bin/env bash
# An installed tandemd given no model serves the demo model installed beside it, and answers a
# completion; usage: demo_model_check.sh TANDEMD CONFIG (CONFIG: the installed sample, which
# sets no model). Its socket and KV pool go to a scratch RUNTIME_DIRECTORY.
set -euo pipefail
tandemd="$1" conf="$2"
want="$(cd "$(dirname "$tandemd")/.." && pwd)/share/tandem/models/stories260K.gguf"
tmp="$(mktemp -d)"
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
mkdir -p "$tmp/run"
sock="$tmp/run/tandem.sock"
RUNTIME_DIRECTORY="$tmp/run" TANDEM_LOG=warn "$tandemd" --config "$conf" --threads 1 2>"$tmp/log" &
pid=$!
for _ in $(seq 150); do
  models="$(curl -sf --unix-socket "$sock" http://x/v1/models 2>/dev/null)" && break
  kill -0 "$pid" 2>/dev/null || { echo "tandemd with no model ended:"; cat "$tmp/log"; exit 1; }
  sleep 0.1
done
[ -n "${models:-}" ] || { echo "tandemd with no model did not come up:"; cat "$tmp/log"; exit 1; }
grep -qF "\"path\":\"$want\"" <<<"$models" || { echo "not the demo model $want: $models"; exit 1; }
out="$(curl -sf --unix-socket "$sock" http://x/v1/completions -H 'Content-Type: application/json' \
  -d '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}')" || { echo "no completion"; cat "$tmp/log"; exit 1; }
grep -q '"choices"' <<<"$out" || { echo "unexpected reply: $out"; exit 1; }
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || { echo "tandemd exited $rc on SIGTERM:"; cat "$tmp/log"; exit 1; }
echo "no model configured: $tandemd served $want"
