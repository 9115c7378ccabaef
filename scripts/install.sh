#!/usr/bin/env bash
# Installs the built tandem and tandemd (and the systemd units, sysusers/tmpfiles entries and
# sample config) under PREFIX, /usr/local by default, so both are on PATH; usage:
# scripts/install.sh [PREFIX]. TANDEM_BUILD names the build folder (default build/, from
# scripts/build.sh or scripts/quickstart.sh); DESTDIR stages the install for a package.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-/usr/local}"
build="${TANDEM_BUILD:-build}"
[ -x "$build/daemon/tandem" ] || { echo "install.sh: no $build/daemon/tandem: run scripts/build.sh first" >&2; exit 1; }
sudo=()
target="${DESTDIR:-}$prefix"
while [ ! -e "$target" ]; do target="$(dirname "$target")"; done
if [ ! -w "$target" ] && [ "$(id -u)" != 0 ]; then sudo=(sudo); fi
"${sudo[@]}" cmake --install "$build" --prefix "$prefix" >/dev/null
echo "installed tandem and tandemd in ${DESTDIR:-}$prefix/bin"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "$prefix/bin is not on PATH: add it (export PATH=\"$prefix/bin:\$PATH\")" ;;
esac
