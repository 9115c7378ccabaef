#!/usr/bin/env bash
# The whole test suite: every suite on a Release build (CUDA compiled where nvcc exists, its
# tests skip without a GPU), then, side by side, the core and daemon suites under ASan+UBSan
# with short libFuzzer runs of every fuzz target, and the engine, ipc and daemon suites (label
# tsan) under ThreadSanitizer (both sanitizer builds need clang). Every build goes through
# ccache when it is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs="$(nproc)"

launcher=()
if command -v ccache >/dev/null; then # (setup.sh installs it: a rebuild of unchanged sources is a cache hit)
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

echo "== Release build: all suites"
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== Sanitizer build (ASan+UBSan)"
# Both sanitizer builds at -O1 with line tables only (-g1), to build faster than at -O2 -g;
# reports still name files and lines.
san_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
san=(-DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF "${san_flags[@]}")
if command -v clang++ >/dev/null; then
  export CC=clang CXX=clang++
else
  echo "clang not found: sanitizer build with the default compiler, no fuzz target"
fi
cmake -S . -B build-asan -G Ninja "${san[@]}" "${launcher[@]}" >/dev/null
cmake --build build-asan -j "$jobs"

tsan=0
if command -v clang++ >/dev/null; then
  echo "== ThreadSanitizer build: the engine, ipc and daemon suites (label tsan)"
  cmake -S . -B build-tsan -G Ninja -DTANDEM_TSAN=ON -DTANDEM_CUDA=OFF -DTANDEM_FUZZ=OFF "${san_flags[@]}" \
    "${launcher[@]}" >/dev/null
  # (not the tandem client: no tsan case runs it)
  cmake --build build-tsan -j "$jobs" --target test_core test_engine test_scheduler test_scheduler_window test_kv_pool test_ipc_shm \
    test_ipc_client test_workers test_server_lifecycle test_batch_jobs tandemd
  tsan=1
else
  echo "clang not found: no ThreadSanitizer build"
fi

# The two sanitizer runs side by side: most of their time is daemons and workers waiting on
# each other, not the cores.
echo "== ASan+UBSan suites (core, fuzz, daemon)$([ $tsan = 1 ] && echo " beside the TSan suites (tsan)")"
(
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L 'core|fuzz|daemon' >build-asan/ctest.log 2>&1
) &
asan_pid=$!
tsan_rc=0
if [ $tsan = 1 ]; then
  # A race makes its process exit 66 at the end (a test, or a daemon the test stops), so the test
  # fails; stopping at the first one instead would leave a test's daemons running.
  TSAN_OPTIONS=second_deadlock_stack=1 ctest --test-dir build-tsan --output-on-failure -j 1 -L tsan \
    >build-tsan/ctest.log 2>&1 || tsan_rc=$?
fi
asan_rc=0
wait $asan_pid || asan_rc=$?
echo "== ASan+UBSan suites"
cat build-asan/ctest.log
if [ $tsan = 1 ]; then
  echo "== TSan suites"
  cat build-tsan/ctest.log
fi
[ $asan_rc = 0 ] && [ $tsan_rc = 0 ]
