#!/usr/bin/env bash
# A fuzzing campaign: every libFuzzer target for MINUTES each (default 10), from its seeds
# (tests/fuzz/seeds/TARGET, and those the build writes) and the corpus it grew before
# (build-asan/tests/fuzz/TARGET_corpus: the sanitizer build that scripts/test.sh makes, whose
# smoke runs share the corpus). Crashes are left in build-asan/fuzz-artifacts/; each one found
# must become a regression test. Each target's log is build-asan/fuzz-logs/TARGET.log, and
# the end prints per target its run time and executions (libFuzzer's
# stat::number_of_executed_units), as rows to paste into docs/reliability.md.
# Usage: scripts/fuzz.sh [-j N] [MINUTES] [TARGET...]
#   -j N (or PARALLEL=N): N targets at a time (default 1; a machine with 2 cores: -j 2).
#   targets: fuzz_gguf fuzz_text fuzz_wire fuzz_http fuzz_tokenizer fuzz_grammar fuzz_config fuzz_ring fuzz_jinja
set -euo pipefail
cd "$(dirname "$0")/.."
parallel="${PARALLEL:-1}"
if [ "${1:-}" = "-j" ]; then
  parallel="${2:?-j needs a number}"
  shift 2
fi
minutes="${1:-10}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] ||
  targets=(fuzz_gguf fuzz_text fuzz_wire fuzz_http fuzz_tokenizer fuzz_grammar fuzz_config fuzz_ring fuzz_jinja)
command -v clang++ >/dev/null || { echo "fuzz.sh: the fuzz targets need clang (apt install clang)" >&2; exit 2; }
export CC=clang CXX=clang++
# scripts/test.sh's flags for this build, so the two share it without rebuilding
cmake -S . -B build-asan -G Ninja -DTANDEM_SANITIZE=ON -DTANDEM_CUDA=OFF -DTANDEM_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" >/dev/null
cmake --build build-asan -j "$(nproc)" --target "${targets[@]}"
dir=build-asan/tests/fuzz
artifacts=build-asan/fuzz-artifacts
logs=build-asan/fuzz-logs
mkdir -p "$artifacts" "$logs"

# One target's run; its summary line goes to $logs/TARGET.result.
run_one() {
  local t=$1 args=() start end rc=0 execs
  if [ -f "tests/fuzz/$t.dict" ]; then args+=("-dict=tests/fuzz/$t.dict"); fi
  args+=("$dir/${t}_corpus") # the first folder: where new inputs go
  if [ -d "tests/fuzz/seeds/$t" ]; then args+=("tests/fuzz/seeds/$t"); fi
  if [ -d "$dir/${t}_seeds" ]; then args+=("$dir/${t}_seeds"); fi
  mkdir -p "$dir/${t}_corpus"
  start=$(date +%s)
  "$dir/$t" -max_total_time=$((minutes * 60)) -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$t-" "${args[@]}" >"$logs/$t.log" 2>&1 || rc=$?
  end=$(date +%s)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -1)
  echo "$t $((end - start)) ${execs:-?} $rc" >"$logs/$t.result"
  echo "== $t: $((end - start)) s, ${execs:-?} executions, exit $rc"
}

running=0
for t in "${targets[@]}"; do
  rm -f "$logs/$t.result"
  echo "== $t: $minutes min"
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

status=0
echo
echo "| target | minutes | executions | exec/s | result |"
echo "|---|---|---|---|---|"
for t in "${targets[@]}"; do
  read -r name secs execs rc <"$logs/$t.result" || { name=$t secs=0 execs=? rc=1; }
  rate=$([ "$execs" != "?" ] && [ "$secs" -gt 0 ] && echo $((execs / secs)) || echo ?)
  result=ok
  if [ "$rc" != 0 ]; then
    result="failed (exit $rc, see $logs/$t.log)"
    status=1
  fi
  printf '| %s | %s | %s | %s | %s |\n' "$name" "$(awk -v s="$secs" 'BEGIN { printf "%.1f", s / 60 }')" "$execs" "$rate" "$result"
done
if ls "$artifacts" | grep -q .; then
  echo "fuzz.sh: crashes in $artifacts/"
  status=1
fi
exit $status
