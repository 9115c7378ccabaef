#!/usr/bin/env bash
# Configures and builds Tandem (Release) in build/; extra arguments go to cmake's configure.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$(nproc)"
