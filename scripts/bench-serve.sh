#!/usr/bin/env bash
# Serving benchmark: starts tandemd on stories260K and on a synthetic TinyLlama-1.1B (made with
# `tandem synth` if missing, never committed), runs `tandem bench --serve --json` against each,
# and writes docs/performance.md and docs/performance.svg from the results.
#
# Needs build/daemon/tandemd and build/daemon/tandem (ninja -C build tandem tandemd) and python3.
# Environment (all optional):
#   BUILD_DIR            build tree (default: build)
#   BENCH_THREADS        tandemd --threads (default: 2)
#   BENCH_DAEMON_ARGS    more tandemd arguments, e.g. "--set max_running=64" (default: none)
#   BENCH_PROMPT_TOKENS  prompt tokens per request (default: 512)
#   BENCH_MAX_TOKENS     tokens generated per request (default: 64)
#   BENCH_SHARED_PREFIX  prefix test length, 0 skips it (default: 1000)
#   SMALL_CONCURRENCY    stories260K levels (default: 1,4,16,64)
#   SMALL_REQUESTS       stories260K requests per level (default: 16,32,64,128)
#   BENCH_LARGE=0        skip the TinyLlama-1.1B run
#   LARGE_CONCURRENCY    TinyLlama levels (default: 1,4,16; it decodes a few to ~20 tok/s here)
#   LARGE_REQUESTS       TinyLlama requests per level (default: 2,4,16)
#   LARGE_MAX_TOKENS     TinyLlama tokens per request (default: BENCH_MAX_TOKENS)
#   LARGE_MODEL          the synthetic model's path (default: $BUILD_DIR/bench/tinyllama-1.1b-synth-int8.gguf)
#   BENCH_LOCAL=0        skip the in-process (placement = local) stories260K run
#   BENCH_OUT            where the JSON results and daemon logs go (default: $BUILD_DIR/bench)
#   BENCH_NOTE           a line on the conditions for the doc
#   BENCH_DOCS=0         keep the JSON only; do not rewrite docs/performance.{md,svg}
set -euo pipefail
cd "$(dirname "$0")/.."

build="${BUILD_DIR:-build}"
name=bench-serve
. scripts/bench-common.sh
need_programs
command -v python3 >/dev/null || { echo "bench-serve: python3 is needed for the report" >&2; exit 1; }

threads="${BENCH_THREADS:-2}"
prompt_tokens="${BENCH_PROMPT_TOKENS:-512}"
max_tokens="${BENCH_MAX_TOKENS:-64}"
shared_prefix="${BENCH_SHARED_PREFIX:-1000}"
out="${BENCH_OUT:-$build/bench}"
large_model="${LARGE_MODEL:-$build/bench/tinyllama-1.1b-synth-int8.gguf}"
mkdir -p "$out"
load_at_start="$(cut -d' ' -f1-3 /proc/loadavg | sed 's/ /, /g')"

run_dir="$(mktemp -d /tmp/tandem-bench-serve.XXXXXX)"
daemon_pid=""
stop_daemon() {
  if [[ -n "$daemon_pid" ]]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
    daemon_pid=""
  fi
}
cleanup() {
  stop_daemon
  rm -rf "$run_dir"
}
trap cleanup EXIT

report_args=()

# bench NAME MODEL CONCURRENCY REQUESTS MAX_TOKENS [TANDEMD ARGS...]
bench() {
  local name="$1" model="$2" conc="$3" reqs="$4" max_tok="$5"
  shift 5
  local sock="$run_dir/$name.sock" log="$out/$name.tandemd.log" result="$out/$name.json"
  # shellcheck disable=SC2206
  local daemon_cmd=("$tandemd" --model "$model" --socket "$sock" --threads "$threads" --log warn
                    --set kv_pool_persist=false "$@" ${BENCH_DAEMON_ARGS:-})
  local bench_cmd=("$tandem" bench --serve --socket "$sock" --concurrency "$conc" --requests "$reqs"
                   --prompt-tokens "$prompt_tokens" --max-tokens "$max_tok" --shared-prefix "$shared_prefix" --json)
  echo "bench-serve: $name: ${daemon_cmd[*]}" >&2
  "${daemon_cmd[@]}" 2>"$log" &
  daemon_pid=$!
  # tandemd answers /health with 200 once the model is loaded
  local ready=0
  for _ in $(seq 1 1200); do
    if "$tandem" status --socket "$sock" >/dev/null 2>&1; then ready=1; break; fi
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [[ $ready != 1 ]]; then
    echo "bench-serve: tandemd did not get ready on $model; its log:" >&2
    cat "$log" >&2
    exit 1
  fi
  echo "bench-serve: $name: ${bench_cmd[*]}" >&2
  local t0=$SECONDS
  "${bench_cmd[@]}" >"$result"
  echo "bench-serve: $name: done in $((SECONDS - t0)) s, $result" >&2
  stop_daemon
  # the commands as a reader can repeat them: the socket is a placeholder
  local shown_daemon="${daemon_cmd[*]}" shown_bench="${bench_cmd[*]}"
  report_args+=(--run "$name" "$result" "${shown_daemon//$sock/SOCK}" "${shown_bench//$sock/SOCK}")
}

bench stories260K ../shared/models/stories260K.gguf "${SMALL_CONCURRENCY:-1,4,16,64}" \
  "${SMALL_REQUESTS:-16,32,64,128}" "$max_tokens"
# the same in one process (placement = local), side by side: what the worker split costs or gains
if [[ "${BENCH_LOCAL:-1}" != 0 ]]; then
  bench stories260K-local ../shared/models/stories260K.gguf "${SMALL_CONCURRENCY:-1,4,16,64}" \
    "${SMALL_REQUESTS:-16,32,64,128}" "$max_tokens" --set placement=local
fi

if [[ "${BENCH_LARGE:-1}" != 0 ]]; then
  synth_tinyllama "$large_model"
  bench tinyllama-1.1b-synth "$large_model" "${LARGE_CONCURRENCY:-1,4,16}" "${LARGE_REQUESTS:-2,4,16}" \
    "${LARGE_MAX_TOKENS:-$max_tokens}"
fi

if [[ "${BENCH_DOCS:-1}" != 0 ]]; then
  env_used=""
  for v in BENCH_THREADS BENCH_DAEMON_ARGS BENCH_PROMPT_TOKENS BENCH_MAX_TOKENS BENCH_SHARED_PREFIX SMALL_CONCURRENCY \
           SMALL_REQUESTS BENCH_LARGE LARGE_CONCURRENCY LARGE_REQUESTS LARGE_MAX_TOKENS; do
    [[ -n "${!v:-}" ]] && env_used+="$v=${!v} "
  done
  python3 scripts/bench_report.py --md docs/performance.md --svg docs/performance.svg \
    --script-cmd "${env_used}scripts/bench-serve.sh" --load "$load_at_start" --note "${BENCH_NOTE:-}" \
    "${report_args[@]}"
  echo "bench-serve: wrote docs/performance.md and docs/performance.svg" >&2
fi
