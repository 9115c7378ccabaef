#!/usr/bin/env bash
# Configures and builds Tandem (Release) in build/; extra arguments go to cmake's configure.
# TANDEM_TARGETS="tandem tandemd" builds only those (the quick start); ccache is used when
# installed (scripts/setup.sh installs it), so a rebuild of unchanged sources is a cache hit.
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
read -r -a targets <<<"${TANDEM_TARGETS:-}"
if [ ${#targets[@]} -gt 0 ]; then
  cmake --build build -j "$(nproc)" --target "${targets[@]}"
else
  cmake --build build -j "$(nproc)"
fi
