#!/usr/bin/env bash
# systemd-analyze verify on the units installed under ROOT (a staged install or an extracted
# package, prefix /usr): the system units with --root, the user units (a user manager cannot
# take --root) as copies whose ExecStart names ROOT's tandemd. Any output fails: verify exits
# 0 on lines it ignores. Usage: verify_root.sh ROOT; exit 77 without systemd-analyze.
set -euo pipefail
root="$1"
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not found: verify --root skipped"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
verify() {
  local out
  out="$(systemd-analyze "$@" 2>&1)" || { echo "verify failed: $out"; exit 1; }
  [ -z "$out" ] || { echo "verify warned: $out"; exit 1; }
}
# the targets the units name (sockets.target, ...) are not under ROOT, hence --recursive-errors=no
verify verify --recursive-errors=no --root="$root" \
  /usr/lib/systemd/system/tandemd.service /usr/lib/systemd/system/tandemd.socket
mkdir -p "$tmp/run"
for u in tandemd.service tandemd.socket; do
  sed "s|^ExecStart=/usr/bin/|ExecStart=$root/usr/bin/|" "$root/usr/lib/systemd/user/$u" >"$tmp/$u"
done
XDG_RUNTIME_DIR="$tmp/run" verify --user verify "$tmp/tandemd.service" "$tmp/tandemd.socket"
echo "units under $root: systemd-analyze verify (system with --root, user): ok"
