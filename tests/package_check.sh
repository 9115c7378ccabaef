#!/usr/bin/env bash
# scripts/package.sh builds a correct tandem_VERSION_ARCH.deb from the build folder: its
# control (fields, Depends from the shared libraries, the conffile, maintainer scripts), its
# files and modes, units that name /usr/bin/tandemd and pass `systemd-analyze verify --root`,
# manual pages that render without warnings, docs whose links resolve, a tandemd that serves
# the packaged demo model when none is configured; and dpkg installs it into a scratch root
# (dpkg --root: the user and directories made, the conffile kept across a reinstall, removal
# and purge). Usage: package_check.sh BUILD_DIR
set -euo pipefail
build="$(cd "$1" && pwd)"
src="$(cd "$(dirname "$0")/.." && pwd)"
for t in dpkg-deb dpkg-shlibdeps; do
  command -v "$t" >/dev/null || { echo "$t not found (dpkg-dev): skipped"; exit 77; }
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "$*"; exit 1; }

deb="$(TANDEM_BUILD="$build" bash "$src/scripts/package.sh" "$tmp")"
version="$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")"
arch="$(dpkg --print-architecture)"
[ "$deb" = "$tmp/tandem_${version}_${arch}.deb" ] || fail "package.sh wrote $deb, not tandem_${version}_${arch}.deb"

# The control file.
dpkg-deb -I "$deb" >/dev/null
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = tandem ] || fail "Package: $(field Package)"
[ "$(field Version)" = "$version" ] || fail "Version: $(field Version)"
[ "$(field Architecture)" = "$arch" ] || fail "Architecture: $(field Architecture)"
[ -n "$(field Maintainer)" ] && [ -n "$(field Description)" ] || fail "no Maintainer or Description"
depends="$(field Depends)"
for lib in libc6 libstdc++6 libdnnl libsystemd0; do
  grep -q "$lib" <<<"$depends" || fail "Depends lacks $lib (from the binaries' libraries): $depends"
done
# each dependency is a package this machine has (where the binaries were built and run)
for p in $(tr ',' '\n' <<<"$depends" | sed -E 's/^ *([^ (]+).*/\1/'); do
  dpkg-query -W "$p" >/dev/null 2>&1 || fail "Depends names $p, which is not installed here"
done
dpkg-deb -e "$deb" "$tmp/control"
[ "$(cat "$tmp/control/conffiles")" = /etc/tandem/tandemd.conf ] || fail "conffiles: $(cat "$tmp/control/conffiles")"
for s in postinst prerm postrm; do
  [ "$(stat -c %a "$tmp/control/$s")" = 755 ] || fail "$s is not 0755"
  sh -n "$tmp/control/$s" || fail "$s: syntax"
done

# The files, their modes and owners, as the archive has them.
listing="$(dpkg-deb -c "$deb")"
mode_of() { awk -v f="./$1" '$6 == f {print $1 " " $2}' <<<"$listing"; }
need() { # PATH MODE
  [ "$(mode_of "$1")" = "$2 root/root" ] || fail "$1: '$(mode_of "$1")', want '$2 root/root'"
}
need usr/bin/tandem -rwxr-xr-x
need usr/bin/tandemd -rwxr-xr-x
need etc/tandem/tandemd.conf -rw-r--r--
for f in usr/lib/systemd/system/tandemd.service usr/lib/systemd/system/tandemd.socket \
         usr/lib/systemd/user/tandemd.service usr/lib/systemd/user/tandemd.socket \
         usr/lib/sysusers.d/tandem.conf usr/lib/tmpfiles.d/tandem.conf \
         usr/share/man/man1/tandem.1.gz usr/share/man/man5/tandemd.conf.5.gz usr/share/man/man8/tandemd.8.gz \
         usr/share/doc/tandem/README.md usr/share/doc/tandem/tandemd.conf \
         usr/share/tandem/models/stories260K.gguf; do
  need "$f" -rw-r--r--
done
for d in "$src"/docs/*.md "$src"/docs/*.svg; do need "usr/share/doc/tandem/docs/$(basename "$d")" -rw-r--r--; done
if awk '$2 != "root/root"' <<<"$listing" | grep -q .; then fail "not owned by root: $(awk '$2 != "root/root"' <<<"$listing")"; fi
if awk '$1 ~ /^d/ && $1 != "drwxr-xr-x"' <<<"$listing" | grep -q .; then fail "directories not 0755: $(awk '$1 ~ /^d/ && $1 != "drwxr-xr-x"' <<<"$listing")"; fi
echo "package $(basename "$deb"): control, Depends ($depends), conffiles, modes: ok"

# The contents.
root="$tmp/root"
dpkg -x "$deb" "$root"
cmp -s "$src/models/stories260K.gguf" "$root/usr/share/tandem/models/stories260K.gguf" || fail "the demo model differs"
cmp -s "$src/systemd/tandemd.conf" "$root/etc/tandem/tandemd.conf" || fail "the conffile is not the sample"
for u in system/tandemd.service user/tandemd.service; do
  grep -q '^ExecStart=/usr/bin/tandemd ' "$root/usr/lib/systemd/$u" || fail "$u: $(grep '^ExecStart=' "$root/usr/lib/systemd/$u")"
done
grep -qx 'ExecStart=/usr/bin/tandemd --config /etc/tandem/tandemd.conf' "$root/usr/lib/systemd/system/tandemd.service" \
  || fail "the system unit does not read /etc/tandem/tandemd.conf"
rc=0
bash "$src/tests/verify_root.sh" "$root" || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 77 ] || exit 1
if command -v man >/dev/null; then
  for page in "$root"/usr/share/man/man*/*.gz; do
    warnings="$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null)" || fail "$page: man failed"
    [ -z "$warnings" ] || fail "$page: $warnings"
  done
  echo "manual pages: render without warnings"
fi
bash "$src/tests/doc_links.sh" "$root/usr/share/doc/tandem"
"$root/usr/bin/tandem" --help >/dev/null
bash "$src/tests/demo_model_check.sh" "$root/usr/bin/tandemd" "$root/etc/tandem/tandemd.conf"

# Without systemd's tools the configure step does nothing, and succeeds.
mkdir -p "$tmp/bare"
env -i PATH=/nonexistent DPKG_ROOT="$tmp/bare" /bin/sh "$tmp/control/postinst" configure || fail "postinst failed without systemd"
[ -z "$(ls -A "$tmp/bare")" ] || fail "postinst without systemd's tools made: $(ls -A "$tmp/bare")"

# dpkg itself, into a scratch root: the maintainer scripts run (chrootless, with DPKG_ROOT)
# and make the tandem user and its directories; nothing is enabled. dpkg sets owners: root only.
if [ "$(id -u)" != 0 ]; then
  echo "not root: the dpkg --root install is skipped"
  exit 0
fi
dr="$tmp/dpkg-root"
mkdir -p "$dr/var/lib/dpkg/info" "$dr/var/lib/dpkg/updates" "$dr/var/lib/dpkg/triggers" "$dr/etc"
touch "$dr/var/lib/dpkg/status" "$dr/var/lib/dpkg/available"
dpkgr() { dpkg --root="$dr" --log=/dev/null --force-script-chrootless --force-depends "$@" >"$tmp/dpkg.log" 2>&1 \
  || fail "dpkg $*: $(cat "$tmp/dpkg.log")"; }
dpkgr -i "$deb"
[ "$(dpkg-query --admindir="$dr/var/lib/dpkg" -W -f '${Status}' tandem)" = "install ok installed" ] || fail "not installed"
if command -v systemd-sysusers >/dev/null; then
  grep -q '^tandem:' "$dr/etc/passwd" || fail "postinst made no tandem user"
  [ "$(stat -c %a "$dr/var/lib/tandem/models")" = 750 ] || fail "postinst made no /var/lib/tandem/models (0750)"
fi
[ ! -e "$dr/etc/systemd/system/sockets.target.wants/tandemd.socket" ] || fail "the install enabled tandemd.socket"
# The admin's edit of the conffile survives a reinstall, and a removal; a purge removes it and
# the links that enabled the units.
echo "model = /var/lib/tandem/models/mine.gguf" >>"$dr/etc/tandem/tandemd.conf"
dpkgr -i "$deb"
grep -q "mine.gguf" "$dr/etc/tandem/tandemd.conf" || fail "a reinstall replaced the edited conffile"
mkdir -p "$dr/etc/systemd/system/sockets.target.wants"
ln -s /usr/lib/systemd/system/tandemd.socket "$dr/etc/systemd/system/sockets.target.wants/tandemd.socket"
dpkgr -r tandem
[ ! -e "$dr/usr/bin/tandemd" ] || fail "remove left /usr/bin/tandemd"
grep -q "mine.gguf" "$dr/etc/tandem/tandemd.conf" || fail "remove took the conffile"
dpkgr --purge tandem
[ ! -e "$dr/etc/tandem/tandemd.conf" ] || fail "purge left the conffile"
[ ! -L "$dr/etc/systemd/system/sockets.target.wants/tandemd.socket" ] || fail "purge left the unit's enable link"
echo "dpkg --root: installed (user and directories made, nothing enabled), conffile kept, removed, purged: ok"
