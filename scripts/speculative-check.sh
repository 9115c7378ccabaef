#!/usr/bin/env bash
# Greedy output with speculation equals plain decoding's, on a model of real size (default: a
# synthetic TinyLlama-1.1B, made under the build dir on first use), through tandemd's prefill
# and decode worker processes: each prompt alone and all four at once, with prompt lookup and
# with a draft model (a random one, with the model's vocabulary), against `tandem run` without
# speculation. Too slow for the test suite (minutes on two cores); test_workers checks the
# same on stories260K.
# Usage: scripts/speculative-check.sh [build-dir] [model.gguf] [tokens]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
model=${2:-$build/tinyllama-synth.gguf}
n=${3:-32}
tandem="$build/daemon/tandem"
if [[ ! -f "$model" ]]; then
  "$tandem" synth -o "$model" --preset tinyllama-1.1b --type q8_0 --seed 1
fi
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
"$tandem" synth -o "$dir/draft.gguf" --vocab-from "$model" --layers 2 --dim 256 --heads 4 --kv-heads 2 --ff 704 \
  --ctx 2048 --type q8_0 --seed 3
prompts=("Lily had a red ball. She liked to play with it. Lily had a red ball. She" "Once upon a time"
         "The cat sat on the mat and the dog sat on the" "Tom had a toy car")
for i in "${!prompts[@]}"; do
  "$tandem" run -m "$model" -p "${prompts[$i]}" -n "$n" --temp 0 --ignore-eos --json -t 2 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["text"])' > "$dir/want$i"
done
fail=0
for spec in "draft_tokens=4" "draft_model=$dir/draft.gguf"; do
  sock="$dir/tandem.sock"
  "$build/daemon/tandemd" --model "$model" --socket "$sock" --threads 2 --log warn --set workers=true \
    --set kv_pool_persist=false --set "$spec" &
  pid=$!
  for _ in $(seq 600); do
    curl -sf --unix-socket "$sock" http://localhost/health >/dev/null 2>&1 && break
    sleep 0.2
  done
  ask() { # prompt index -> the completion's text
    curl -sf --unix-socket "$sock" http://localhost/v1/completions -H 'Content-Type: application/json' \
      -d "$(python3 -c 'import json, sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": int(sys.argv[2]),
            "temperature": 0, "ignore_eos": True}))' "${prompts[$1]}" "$n")" |
      python3 -c 'import json, sys; j = json.load(sys.stdin); print(j["choices"][0]["text"])
d = j["usage"].get("completion_tokens_details", {})
print(d.get("accepted_prediction_tokens", 0), d.get("rejected_prediction_tokens", 0), file=sys.stderr)'
  }
  for i in "${!prompts[@]}"; do ask "$i" > "$dir/alone$i" 2>>"$dir/counts"; done
  for i in "${!prompts[@]}"; do ask "$i" > "$dir/busy$i" 2>>"$dir/counts" & done
  wait $(jobs -p | grep -v "^$pid$")
  for i in "${!prompts[@]}"; do
    for kind in alone busy; do
      if cmp -s "$dir/want$i" "$dir/$kind$i"; then echo "ok   $spec prompt $i $kind"
      else echo "FAIL $spec prompt $i $kind"; fail=1; fi
    done
  done
  echo "     $spec: accepted/rejected drafts per request: $(tr '\n' ' ' < "$dir/counts")"
  rm -f "$dir/counts"
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
exit $fail
