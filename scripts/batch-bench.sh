#!/usr/bin/env bash
# Offline throughput of `tandem batch`, side by side in one run with `tandem bench` on the same
# model, threads and batch size: N requests of P prompt tokens (random ids, no shared prefix)
# and G generated tokens each (ignore_eos), run in-process with --max-running B. Prints the
# figures and the ratios, and writes them as JSON.
#
#   generated tok/s / bench's decode tok/s at batch B      (decode alone: the batch run also prefills)
#   ideal time / batch time, the ideal being N*P tokens at bench's prefill rate plus N*G at its
#   batch-B decode rate: the share of what the kernels allow for the same work
#
# Then the same file by a running tandemd (--socket) while a client sends live requests one
# at a time: their TTFT P50/P99 against the same requests on the idle daemon.
#
# Needs build/daemon/tandem and tandemd, and python3. Environment (all optional):
#   BUILD_DIR       build tree (default: build)
#   BATCH_MODEL     the model (default: the synthetic TinyLlama-1.1B that scripts/bench-serve.sh
#                   makes, $BUILD_DIR/bench/tinyllama-1.1b-synth-int8.gguf, made if missing)
#   BATCH_REQUESTS  N (default 256)    BATCH_PROMPT  P (default 128)   BATCH_GEN  G (default 128)
#   BATCH_RUNNING   B (default 32)     BATCH_THREADS (default 2)
#   BATCH_LIVE      live requests measured in each TTFT phase (default 20; 0 skips the phase)
#   BATCH_SETTLE    seconds the batch runs by the daemon before live requests are measured (default 20)
#   BATCH_INPROCESS=0  skip the in-process run and its comparison with tandem bench
#   BATCH_OUT       where results go (default $BUILD_DIR/bench/batch)
set -euo pipefail
cd "$(dirname "$0")/.."

build="${BUILD_DIR:-build}"
name=batch-bench
. scripts/bench-common.sh
need_programs
model="${BATCH_MODEL:-$build/bench/tinyllama-1.1b-synth-int8.gguf}"
n="${BATCH_REQUESTS:-256}" p="${BATCH_PROMPT:-128}" g="${BATCH_GEN:-128}"
running="${BATCH_RUNNING:-32}" threads="${BATCH_THREADS:-2}" live="${BATCH_LIVE:-20}"
out="${BATCH_OUT:-$build/bench/batch}"
mkdir -p "$out"
[[ -n "${BATCH_MODEL:-}" ]] || synth_tinyllama "$model"
# Prompt ids: drawn from the ids of a text in the model's own vocabulary.
vocab_ids="$("$tandem" tokenize -m "$model" "$(python3 -c "
import random
r = random.Random(7)
w = 'the a cat dog ran sat happy blue little girl boy tree sun moon play jump big small'.split()
print(' '.join(r.choice(w) + str(r.randrange(100)) for _ in range(400)))")")"

run_dir="$(mktemp -d /tmp/tandem-batch-bench.XXXXXX)"
daemon_pid=""
cleanup() {
  [[ -z "$daemon_pid" ]] || { kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; }
  rm -rf "$run_dir"
}
trap cleanup EXIT

python3 - "$run_dir/in.jsonl" "$n" "$p" "$g" "$vocab_ids" <<'EOF'
import json, random, sys
path, n, p, g = sys.argv[1], *map(int, sys.argv[2:5])
ids = sorted(set(json.loads(sys.argv[5])) - {0, 1, 2}) # (no BOS, EOS or unknown)
rng = random.Random(1)
with open(path, 'w') as f:
    for i in range(n):
        body = {'prompt': [rng.choice(ids) for _ in range(p)], 'max_tokens': g, 'ignore_eos': True,
                'temperature': 0}
        f.write(json.dumps({'custom_id': f'r{i}', 'method': 'POST', 'url': '/v1/completions', 'body': body}) + '\n')
EOF

inprocess="${BATCH_INPROCESS:-1}" start=0 end=0
if [[ "$inprocess" != 0 ]]; then
  echo "batch-bench: tandem bench -m $model -p $p --batch $running -t $threads" >&2
  "$tandem" bench -m "$model" -p "$p" -n 32 --batch "$running" -t "$threads" --no-raw --json >"$out/bench.json"

  echo "batch-bench: tandem batch ($n requests, $p + $g tokens, --max-running $running)" >&2
  rm -f "$out/out.jsonl"
  start=$(date +%s.%N)
  "$tandem" batch "$run_dir/in.jsonl" -o "$out/out.jsonl" -m "$model" -t "$threads" --max-running "$running" \
    2>"$out/batch.log"
  end=$(date +%s.%N)
  tail -1 "$out/batch.log" >&2
fi

# Live requests one at a time: TTFT on the idle daemon, then with the same file running by it.
if [[ "$live" -gt 0 ]]; then
  sock="$run_dir/tandemd.sock"
  "$tandemd" --model "$model" --socket "$sock" --threads "$threads" --log warn --set kv_pool_persist=false \
    --set "max_running=$running" --set "kv_pool=$run_dir/pool" 2>"$out/tandemd.log" &
  daemon_pid=$!
  for _ in $(seq 1 1200); do "$tandem" status --socket "$sock" >/dev/null 2>&1 && break; sleep 0.1; done
  ttft() { # the TTFT figures of LIVE streamed requests, one at a time, their prompts drawn from seed $1
    "$tandem" bench --serve --socket "$sock" --concurrency 1 --requests "$live" --prompt-tokens "$p" \
      --max-tokens 16 --shared-prefix 0 --seed "$1" --json
  }
  ttft 1 >"$out/ttft_idle.json"
  "$tandem" batch "$run_dir/in.jsonl" -o "$run_dir/socket.jsonl" --socket "$sock" --concurrency "$running" \
    2>"$out/batch_socket.log" &
  batch_pid=$!
  sleep "${BATCH_SETTLE:-20}" # past the first prefills: the daemon's batch is full
  ttft 2 >"$out/ttft_busy.json" # (other prompts: none of the first ones' pages is cached)
  kill -INT "$batch_pid" 2>/dev/null || true
  wait "$batch_pid" 2>/dev/null || true
fi

python3 - "$out" "$n" "$p" "$g" "$running" "$start" "$end" "$live" "$inprocess" <<'EOF'
import json, os, sys
out, n, p, g, b = sys.argv[1], *map(int, sys.argv[2:6])
start, end, live, inprocess = float(sys.argv[6]), float(sys.argv[7]), int(sys.argv[8]), sys.argv[9] != '0'
r = {'requests': n, 'prompt_tokens': p, 'gen_tokens': g, 'max_running': b}
if inprocess:
    bench = json.load(open(os.path.join(out, 'bench.json')))
    lines = [json.loads(l) for l in open(os.path.join(out, 'out.jsonl'))]
    ok = [l for l in lines if l['response'] and l['response']['status_code'] == 200]
    gen = sum(l['response']['body']['usage']['completion_tokens'] for l in ok)
    secs = end - start
    decode = bench['decode_batch_tok_s'][str(b)]
    prefill = bench['prefill_tok_s']
    ideal = n * p / prefill + n * g / decode
    r.update({'answered': len(ok), 'batch_s': secs, 'gen_tok_s': gen / secs, 'bench_decode_tok_s': decode,
              'bench_prefill_tok_s': prefill, 'gen_vs_decode': gen / secs / decode, 'ideal_s': ideal,
              'ideal_vs_batch': ideal / secs})
    print(f"batch: {len(ok)}/{n} answered, {gen} tokens generated in {secs:.1f} s: {gen / secs:.1f} tok/s")
    print(f"bench: prefill {prefill:.1f} tok/s ({p} tokens), decode {decode:.1f} tok/s aggregate at batch {b}")
    print(f"generated tok/s / bench decode at batch {b}: {r['gen_vs_decode']:.2f}")
    print(f"ideal time (prefill + decode at bench's rates) {ideal:.1f} s / batch time {secs:.1f} s: "
          f"{r['ideal_vs_batch']:.2f}")
if live > 0:
    idle = json.load(open(os.path.join(out, 'ttft_idle.json')))['levels'][0]
    busy = json.load(open(os.path.join(out, 'ttft_busy.json')))['levels'][0]
    r['ttft_idle_ms'], r['ttft_busy_ms'] = idle['ttft_ms'], busy['ttft_ms']
    print(f"live TTFT idle P50 {idle['ttft_ms']['p50']:.0f} ms P99 {idle['ttft_ms']['p99']:.0f} ms; "
          f"with the batch running P50 {busy['ttft_ms']['p50']:.0f} ms P99 {busy['ttft_ms']['p99']:.0f} ms "
          f"({busy['ttft_ms']['p99'] / idle['ttft_ms']['p99']:.2f}x)")
json.dump(r, open(os.path.join(out, 'result.json'), 'w'), indent=1)
EOF
