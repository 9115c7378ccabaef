#!/usr/bin/env bash
# `cmake --install` into a temporary prefix places every file (the docs with working links,
# the manual pages, the demo model that tandemd then serves with no model configured), and a
# staged install (DESTDIR, --prefix /usr) gets units that name /usr and /etc and pass
# `systemd-analyze verify --root`; usage: install_check.sh CMAKE BUILD_DIR HAS_TANDEMD
set -euo pipefail
cmake="$1" build="$2" has_tandemd="$3"
prefix="$(mktemp -d)" stage="$(mktemp -d)"
trap 'rm -rf "$prefix" "$stage"' EXIT

"$cmake" --install "$build" --prefix "$prefix" >/dev/null
want=(
  bin/tandem
  lib/systemd/system/tandemd.service lib/systemd/system/tandemd.socket
  lib/systemd/user/tandemd.service lib/systemd/user/tandemd.socket
  lib/sysusers.d/tandem.conf lib/tmpfiles.d/tandem.conf
  share/doc/tandem/tandemd.conf share/doc/tandem/README.md
  share/man/man1/tandem.1 share/man/man5/tandemd.conf.5 share/man/man8/tandemd.8
  share/tandem/models/stories260K.gguf
  etc/tandem/tandemd.conf
)
src="$(dirname "$0")/.."
for d in "$src"/docs/*.md "$src"/docs/*.svg; do want+=("share/doc/tandem/docs/$(basename "$d")"); done
[ "$has_tandemd" = 1 ] && want+=(bin/tandemd)
for f in "${want[@]}"; do
  [ -f "$prefix/$f" ] || { echo "missing after install: $f"; exit 1; }
done
[ -x "$prefix/bin/tandem" ] || { echo "bin/tandem is not executable"; exit 1; }
# The units name the prefix given to --install, not the one the build was configured with.
grep -qx "ExecStart=$prefix/bin/tandemd --config $prefix/etc/tandem/tandemd.conf" \
  "$prefix/lib/systemd/system/tandemd.service" \
  || { echo "the installed unit's ExecStart does not name the installed tandemd and config:"
       grep '^ExecStart=' "$prefix/lib/systemd/system/tandemd.service"; exit 1; }
"$prefix/bin/tandem" --help >/dev/null
cmp -s "$src/models/stories260K.gguf" "$prefix/share/tandem/models/stories260K.gguf" || { echo "the demo model differs"; exit 1; }
bash "$src/tests/doc_links.sh" "$prefix/share/doc/tandem"
[ "$has_tandemd" != 1 ] || bash "$src/tests/demo_model_check.sh" "$prefix/bin/tandemd" "$prefix/etc/tandem/tandemd.conf"

# A reinstall keeps the admin's configuration.
echo "# edited by the admin" >> "$prefix/etc/tandem/tandemd.conf"
"$cmake" --install "$build" --prefix "$prefix" >/dev/null
grep -q "# edited by the admin" "$prefix/etc/tandem/tandemd.conf" || { echo "reinstall overwrote etc/tandem/tandemd.conf"; exit 1; }
echo "installed: ${want[*]}"

# scripts/install.sh (README's step onto PATH) installs the same into the prefix it is given.
script_prefix="$stage/script"
out="$(TANDEM_BUILD="$build" PATH="/usr/bin:/bin" bash "$(dirname "$0")/../scripts/install.sh" "$script_prefix")"
[ -x "$script_prefix/bin/tandem" ] || { echo "scripts/install.sh did not install bin/tandem: $out"; exit 1; }
"$script_prefix/bin/tandem" --help >/dev/null
grep -qF "$script_prefix/bin is not on PATH" <<<"$out" || { echo "scripts/install.sh gave no PATH hint: $out"; exit 1; }
rm -rf "$script_prefix"
echo "scripts/install.sh: ok"

# A staged install for a package: DESTDIR=STAGE --prefix /usr.
DESTDIR="$stage" "$cmake" --install "$build" --prefix /usr >/dev/null
staged=(
  usr/bin/tandem
  usr/lib/systemd/system/tandemd.service usr/lib/systemd/system/tandemd.socket
  usr/lib/systemd/user/tandemd.service usr/lib/systemd/user/tandemd.socket
  usr/lib/sysusers.d/tandem.conf usr/lib/tmpfiles.d/tandem.conf
  usr/share/doc/tandem/tandemd.conf usr/share/doc/tandem/README.md usr/share/doc/tandem/docs/config.md
  usr/share/man/man8/tandemd.8 usr/share/tandem/models/stories260K.gguf
  etc/tandem/tandemd.conf
)
for f in "${staged[@]}"; do
  [ -f "$stage/$f" ] || { echo "missing after the staged install: $f"; exit 1; }
done
[ ! -e "$stage/${stage#/}" ] || { echo "the staged install wrote under \$DESTDIR\$DESTDIR: $stage/${stage#/}"; exit 1; }
if grep -rlF -e "$stage" -e /usr/local "$stage/usr/lib" "$stage/etc"; then
  echo "the files above name the stage or /usr/local"
  exit 1
fi
need() { grep -qx -- "$2" "$stage/$1" || { echo "$1 lacks: $2"; grep '^ExecStart=' "$stage/$1"; exit 1; }; }
need usr/lib/systemd/system/tandemd.service 'ExecStart=/usr/bin/tandemd --config /etc/tandem/tandemd.conf'
need usr/lib/systemd/user/tandemd.service \
  'ExecStart=/usr/bin/tandemd --config %E/tandem/tandemd.conf --socket %t/tandem/tandem.sock'
need usr/lib/systemd/system/tandemd.service 'Documentation=file:/usr/share/doc/tandem/README.md'

# Without a tandemd target, a stand-in where the units expect it.
if [ "$has_tandemd" != 1 ]; then printf '#!/bin/sh\nexit 0\n' >"$stage/usr/bin/tandemd"; chmod 755 "$stage/usr/bin/tandemd"; fi
rc=0
bash "$(dirname "$0")/verify_root.sh" "$stage" || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 77 ] || exit 1
echo "staged install (DESTDIR, --prefix /usr): units name /usr/bin/tandemd and /etc/tandem"
