#!/usr/bin/env bash
# Installs dependencies, builds, starts tandemd on the default model, sends it one prompt with
# the `tandem` client (the reply streams to the terminal), then stops the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TANDEM_TARGETS="tandem tandemd" bash scripts/build.sh # (the test suites build under scripts/test.sh)
model="${TANDEM_MODEL:-$(pwd)/models/stories260K.gguf}" # the bundled demo model (models/README.md)
prompt="${1:-Once upon a time}"
run_dir="$(mktemp -d /tmp/tandem-quickstart.XXXXXX)"
export TANDEM_SOCKET="$run_dir/tandem.sock"

./build/daemon/tandemd --model "$model" --socket "$TANDEM_SOCKET" --set kv_pool_persist=false 2>"$run_dir/tandemd.log" &
daemon_pid=$!
cleanup() {
  kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$run_dir"
}
trap cleanup EXIT

# tandemd answers /health with 200 once the model is loaded.
for _ in $(seq 1 300); do
  curl -sf --unix-socket "$TANDEM_SOCKET" http://localhost/health >/dev/null 2>&1 && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$run_dir/tandemd.log" >&2; exit 1; }
  sleep 0.1
done
echo "tandemd: serving $model on $TANDEM_SOCKET"
echo "\$ tandem --raw --temp 0 --max-tokens 128 \"$prompt\""
printf '%s' "$prompt"
./build/daemon/tandem --raw --temp 0 --max-tokens 128 "$prompt"
echo
echo "The programs are build/daemon/tandem and build/daemon/tandemd; \`bash scripts/install.sh\` puts"
echo "them on PATH (/usr/local/bin, with the systemd units and the sample config; see README.md)."
