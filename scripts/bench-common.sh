# Sourced by the benchmark scripts (bench-serve.sh, batch-bench.sh): the programs they run and
# the synthetic model they measure. Expects $build (the build tree) and $name (for messages).

# Exits with a message unless tandem and tandemd are built; sets $tandem and $tandemd.
need_programs() {
  tandem="$build/daemon/tandem"
  tandemd="$build/daemon/tandemd"
  local b
  for b in "$tandemd" "$tandem"; do
    [[ -x "$b" ]] || { echo "$name: $b is missing; build it: ninja -C $build tandem tandemd" >&2; exit 1; }
  done
}

# Makes the synthetic TinyLlama-1.1B at PATH unless it is there: random weights at the real
# shape (tandem synth), pre-quantized (tandem quantize) so that every process loads the same
# INT8 weights without converting them. Never committed: it lives in the build tree.
synth_tinyllama() {
  local path="$1"
  [[ -f "$path" ]] && return 0
  echo "$name: making $path (tandem synth --preset tinyllama-1.1b; tandem quantize)" >&2
  mkdir -p "$(dirname "$path")"
  "$tandem" synth --preset tinyllama-1.1b -o "$path.q8_0.tmp"
  "$tandem" quantize "$path.q8_0.tmp" "$path"
  rm -f "$path.q8_0.tmp"
}
