#!/usr/bin/env bash
# The real client SDKs against a built tandemd: the OpenAI Node SDK (tests/sdk/openai_check.mjs
# over TCP, the batch flow tests/sdk/openai_batch.mjs over the Unix socket), Anthropic's
# (anthropic_check.mjs: /v1/messages), ollama-js (ollama_check.mjs: /api/), and the reasoning
# split through the OpenAI SDK against a synthetic Qwen3-like model (reasoning_check.mjs).
# The Responses interface of the OpenAI SDK: responses_check.mjs.
# Installs the SDKs from the npm registry into BUILD/sdk-node on first use; with --no-install
# (the ctest sdk_check) it exits 77, skipped, when they are not there (CI has no downloads).
# Usage: scripts/sdk-check.sh [--no-install] [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
install=1
if [[ "${1:-}" == "--no-install" ]]; then install=0; shift; fi
build=${1:-build}
sdk="$build/sdk-node"
packages=(openai @anthropic-ai/sdk ollama)
missing=0
for p in "${packages[@]}"; do [[ -d "$sdk/node_modules/$p" ]] || missing=1; done
if ((missing)); then
  if ((!install)) || ! command -v npm >/dev/null; then
    echo "skipped: the SDKs are not installed in $sdk (run scripts/sdk-check.sh once with the npm registry)"
    exit 77
  fi
  mkdir -p "$sdk"
  npm install --prefix "$sdk" --silent --no-audit --no-fund "${packages[@]}" >/dev/null
fi
command -v node >/dev/null || { echo "skipped: no node"; exit 77; }
dir=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null; wait $p 2>/dev/null; done; rm -rf "$dir"' EXIT
# serve MODEL PORT SOCKET: a tandemd on both a Unix socket and 127.0.0.1:PORT, waited for.
serve() {
  "$build/daemon/tandemd" --model "$1" --socket "$3" --threads 2 --log warn \
    --listen-tcp "127.0.0.1:$2" --set kv_pool_persist=false --set "kv_pool=$3.kv" --set "state_dir=$dir/state-$2" &
  pids+=($!)
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$2/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "tandemd on $1 did not start" >&2
  return 1
}
port=$((20000 + RANDOM % 20000))
serve models/stories260K.gguf "$port" "$dir/tandem.sock"
cp tests/sdk/*.mjs "$sdk/"
TANDEM_URL="http://127.0.0.1:$port/v1" node "$sdk/responses_check.mjs"
TANDEM_URL="http://127.0.0.1:$port/v1" node "$sdk/anthropic_check.mjs"
TANDEM_URL="http://127.0.0.1:$port/v1" node "$sdk/ollama_check.mjs"

# A reasoning model: Qwen3's chat template in short, <think> and </think> as tokens.
cat > "$dir/qwen3.jinja" <<'JINJA'
{%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}
JINJA
"$build/daemon/tandem" synth -o "$dir/qwen3-like.gguf" --chat-template "$dir/qwen3.jinja" \
  --add-token '<|im_start|>' --add-token '<|im_end|>' --add-token '<think>' --add-token '</think>'
think=$("$build/daemon/tandem" tokenize --parse-special -m "$dir/qwen3-like.gguf" '<think>' | grep -o '[0-9]\+' | tail -1)
port2=$((port + 1))
serve "$dir/qwen3-like.gguf" "$port2" "$dir/reasoning.sock"
THINK_TOKEN="$think" TANDEM_URL="http://127.0.0.1:$port2/v1" node "$sdk/reasoning_check.mjs"
TANDEM_URL="http://127.0.0.1:$port/v1" node "$sdk/openai_check.mjs"
TANDEM_SOCKET="$dir/tandem.sock" node "$sdk/openai_batch.mjs"
echo "sdk-check: all passed"
