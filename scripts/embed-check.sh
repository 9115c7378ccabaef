#!/usr/bin/env bash
# What an embedding costs against prefill of the same length: tandemd on a model of real size
# (default: a synthetic TinyLlama-1.1B, made under the build dir on first use), in one process
# (placement=local) with the prefix cache off; each round embeds 8 texts of ~200 words in one
# /v1/embeddings request, then sends 8 other texts as completions of one token (prefill, then
# one decode step) concurrently, and prints both times and their ratio. Mean pooling sums one
# row a prefill chunk, so the ratio should be about 1. Too slow for the test suite;
# test_embeddings and test_server_api check the vectors.
# Usage: scripts/embed-check.sh [build-dir] [model.gguf] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
model=${2:-$build/tinyllama-synth.gguf}
rounds=${3:-3}
if [[ ! -f "$model" ]]; then
  "$build/daemon/tandem" synth -o "$model" --preset tinyllama-1.1b --type q8_0 --seed 1
fi
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
"$build/daemon/tandemd" --model "$model" --socket "$dir/tandem.sock" --threads 2 --log warn \
  --set prefix_cache=false --set placement=local &
for _ in $(seq 600); do
  curl -sf --unix-socket "$dir/tandem.sock" http://localhost/health >/dev/null 2>&1 && break
  sleep 0.1
done
python3 - "$dir/tandem.sock" "$rounds" <<'PY'
import json, random, socket, sys, threading, time

sock_path, rounds = sys.argv[1], int(sys.argv[2])

def post(path, body):
    data = json.dumps(body).encode()
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)
    s.sendall(b"POST %s HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % (path.encode(), len(data)) + data)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    if b" 200 " not in out.split(b"\r\n", 1)[0]:
        sys.exit(f"{path}: {out[:300]!r}")

random.seed(1)
words = "the a dog cat ran park sun tree red blue happy little girl boy mom dad ball play jump sing".split()
def text():
    return " ".join(random.choice(words) for _ in range(200))

for r in range(rounds):
    texts = [text() for _ in range(8)]
    t0 = time.monotonic()
    post("/v1/embeddings", {"input": texts})
    embed = time.monotonic() - t0
    texts = [text() for _ in range(8)]
    t0 = time.monotonic()
    threads = [threading.Thread(target=post, args=("/v1/completions", {"prompt": t, "max_tokens": 1})) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    prefill = time.monotonic() - t0
    print(f"round {r + 1}: embeddings of 8 texts {embed:.2f} s, prefill of 8 others {prefill:.2f} s, "
          f"ratio {embed / prefill:.2f}")
PY
