#!/usr/bin/env bash
# `cmake --install` into a temporary prefix places every file; usage: install_check.sh CMAKE BUILD_DIR HAS_TANDEMD
set -euo pipefail
cmake="$1" build="$2" has_tandemd="$3"
prefix="$(mktemp -d)"
trap 'rm -rf "$prefix"' EXIT

"$cmake" --install "$build" --prefix "$prefix" >/dev/null
want=(
  bin/tandem
  lib/systemd/system/tandemd.service lib/systemd/system/tandemd.socket
  lib/systemd/user/tandemd.service lib/systemd/user/tandemd.socket
  lib/sysusers.d/tandem.conf lib/tmpfiles.d/tandem.conf
  share/doc/tandem/tandemd.conf share/doc/tandem/README.md
  etc/tandem/tandemd.conf
)
[ "$has_tandemd" = 1 ] && want+=(bin/tandemd)
for f in "${want[@]}"; do
  [ -f "$prefix/$f" ] || { echo "missing after install: $f"; exit 1; }
done
[ -x "$prefix/bin/tandem" ] || { echo "bin/tandem is not executable"; exit 1; }
grep -Eq '^ExecStart=/.*/tandemd --config /.*/tandem/tandemd.conf$' "$prefix/lib/systemd/system/tandemd.service" \
  || { echo "the installed unit's ExecStart does not name the installed tandemd and config"; exit 1; }
"$prefix/bin/tandem" --help >/dev/null

# A reinstall keeps the admin's configuration.
echo "# edited by the admin" >> "$prefix/etc/tandem/tandemd.conf"
"$cmake" --install "$build" --prefix "$prefix" >/dev/null
grep -q "# edited by the admin" "$prefix/etc/tandem/tandemd.conf" || { echo "reinstall overwrote etc/tandem/tandemd.conf"; exit 1; }
echo "installed: ${want[*]}"
