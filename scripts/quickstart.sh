#!/usr/bin/env bash
# Installs dependencies, builds, and runs the main job on the default model:
# a prompt answered by `tandem run` (offline; the daemon takes this over when it lands).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
model="${TANDEM_MODEL:-$(pwd)/../shared/models/stories260K.gguf}"
prompt="${1:-Once upon a time}"
echo "tandem: model $model"
./build/daemon/tandem run -m "$model" -p "$prompt" -n 128 --temp 0
