#!/usr/bin/env bash
# Installs Tandem's build and test dependencies from Debian 12 packages. Idempotent.
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev libboost-dev libspdlog-dev libfmt-dev doctest-dev nlohmann-json3-dev libcli11-dev
  libsystemd-dev systemd curl libedit-dev tmux
  libcurl4-openssl-dev libssl-dev
  dpkg-dev man-db
  clang libclang-rt-14-dev
  ccache
  python3-jinja2
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
