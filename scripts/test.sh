#!/usr/bin/env bash
# The whole test suite: every suite on a Release build (CUDA compiled where nvcc exists, its
# tests skip without a GPU), then the core and daemon suites under ASan+UBSan, plus a libFuzzer smoke
# run of the GGUF parser when clang is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs="$(nproc)"

echo "== Release build: all suites"
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== Sanitizer build (ASan+UBSan): core suites"
san=(-DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)
if command -v clang++ >/dev/null; then
  export CC=clang CXX=clang++
else
  echo "clang not found: sanitizer build with the default compiler, no fuzz target"
fi
cmake -S . -B build-asan -G Ninja "${san[@]}" >/dev/null
cmake --build build-asan -j "$jobs"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-asan --output-on-failure -L 'core|fuzz|daemon'
