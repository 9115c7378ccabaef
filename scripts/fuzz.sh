#!/usr/bin/env bash
# A fuzzing campaign: every libFuzzer target for MINUTES each (default 10), from its seeds and
# the corpus it grew before (build-asan/tests/fuzz/*_corpus: the sanitizer build that
# scripts/test.sh makes, whose smoke runs share the corpus). Crashes are left in
# build-asan/fuzz-artifacts/; each one found must become a regression test.
# Usage: scripts/fuzz.sh [MINUTES] [TARGET...]   (targets: fuzz_gguf fuzz_text fuzz_wire)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${1:-10}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_gguf fuzz_text fuzz_wire)
command -v clang++ >/dev/null || { echo "fuzz.sh: the fuzz targets need clang (apt install clang)" >&2; exit 2; }
export CC=clang CXX=clang++
cmake -S . -B build-asan -G Ninja -DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF -DTANDEM_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-asan -j "$(nproc)" --target "${targets[@]}"
artifacts=build-asan/fuzz-artifacts
mkdir -p "$artifacts"
status=0
for t in "${targets[@]}"; do
  dir=build-asan/tests/fuzz
  mkdir -p "$dir/${t}_corpus"
  echo "== $t: $minutes min"
  if ! "$dir/$t" -max_total_time=$((minutes * 60)) -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$artifacts/$t-" "$dir/${t}_corpus" "$dir/${t}_seeds" 2>&1 | tail -4; then
    status=1
  fi
done
if ls "$artifacts" | grep -q .; then
  echo "fuzz.sh: crashes in $artifacts/"
  status=1
fi
exit $status
