#!/usr/bin/env bash
# Builds the Debian package tandem_VERSION_ARCH.deb from the CMake install rules: usage:
# scripts/package.sh [OUTDIR] (default: the build folder). TANDEM_BUILD names the build
# folder (default build/; tandem and tandemd must be built there). The package installs
# under /usr with the configuration in /etc/tandem (a conffile), its Depends come from the
# binaries' shared libraries (dpkg-shlibdeps), and its maintainer scripts (scripts/deb/)
# create the tandem user and directories but enable and start nothing. DEBFULLNAME and
# DEBEMAIL name the maintainer; CMAKE the cmake to run. Prints the package's path.
set -euo pipefail
cd "$(dirname "$0")/.."
src="$(pwd)"
build="${TANDEM_BUILD:-build}"
out="${1:-$build}"
for b in tandem tandemd; do
  [ -x "$build/daemon/$b" ] || { echo "package.sh: no $build/daemon/$b: build it first (scripts/build.sh)" >&2; exit 1; }
done
for t in dpkg-deb dpkg-shlibdeps; do
  command -v "$t" >/dev/null || { echo "package.sh: $t not found (apt install dpkg-dev)" >&2; exit 1; }
done
version="$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")"
[ -n "$version" ] || { echo "package.sh: no project version in $build/CMakeCache.txt" >&2; exit 1; }
arch="$(dpkg --print-architecture)"
umask 022
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root="$work/root"
mkdir -p "$root/DEBIAN"
chmod 755 "$root"

# The files: what `cmake --install --prefix /usr` puts there (units naming /usr/bin/tandemd and
# /etc/tandem/tandemd.conf), binaries stripped, manual pages compressed as Debian has them.
DESTDIR="$root" "${CMAKE:-cmake}" --install "$build" --prefix /usr --strip >/dev/null
gzip -9n "$root"/usr/share/man/man*/*

# Depends: the packages of the binaries' shared libraries. dpkg-shlibdeps wants a
# debian/control, which a package built without a source tree does not have: a minimal one.
mkdir -p "$work/debian"
printf 'Source: tandem\n\nPackage: tandem\nArchitecture: any\n' >"$work/debian/control"
depends="$(cd "$work" && dpkg-shlibdeps -O --warnings=0 root/usr/bin/tandemd root/usr/bin/tandem |
  sed -n 's/^shlibs:Depends=//p')"
[ -n "$depends" ] || { echo "package.sh: dpkg-shlibdeps found no dependencies" >&2; exit 1; }

maintainer="${DEBFULLNAME:-Tandem developers} <${DEBEMAIL:-tandem@localhost}>"
cat >"$root/DEBIAN/control" <<CONTROL
Package: tandem
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: $depends
Section: misc
Priority: optional
Description: LLM inference daemon for local programs
 tandemd keeps a Llama-family GGUF model loaded with INT8 weights and serves it to
 local programs over a Unix socket (HTTP/1.1, compatible with the OpenAI API,
 streaming). Prefill runs on an NVIDIA GPU when one is usable and decode on the CPU,
 in two worker processes sharing a paged KV cache; requests are batched continuously
 and prompt prefixes are reused. tandem is its command-line client, and runs models
 offline.
 .
 The package has the systemd units (tandemd.socket, tandemd.service, system and
 user), the configuration /etc/tandem/tandemd.conf, manual pages, the docs, and a
 tiny demo model that tandemd serves when none is configured.
CONTROL
find "$root/etc" -type f | sed "s|^$root||" | sort >"$root/DEBIAN/conffiles"
install -m 755 scripts/deb/postinst scripts/deb/prerm scripts/deb/postrm "$root/DEBIAN/"
(cd "$root" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

mkdir -p "$out"
deb="$(cd "$out" && pwd)/tandem_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "$deb"
