# Sourced by the terminal checks (chat_tmux_check.sh, batch_tmux_check.sh): a tmux server of
# their own in a scratch directory, and waiting on what the pane shows. Expects $session; a
# check may define on_fail to print more when it fails.
command -v tmux >/dev/null || { echo "skipped: tmux is not installed"; exit 77; }
command -v python3 >/dev/null || { echo "skipped: python3 is not installed"; exit 77; }
tmp="$(mktemp -d)"
export TMUX_TMPDIR="$tmp" # a tmux server of our own, ended with the check

fail() {
  echo "FAIL: $1"
  echo "--- the terminal:"
  tmux capture-pane -p -t "$session" || true
  if declare -F on_fail >/dev/null; then on_fail; fi
  exit 1
}
# wait_for WHAT CMD...: CMD succeeds within 10 s (or $wait_s), or the check fails saying WHAT.
wait_for() {
  local what="$1"
  shift
  for _ in $(seq $((${wait_s:-10} * 10))); do "$@" && return 0; sleep 0.1; done
  fail "$what"
}
pane_has() { tmux capture-pane -p -t "$session" | grep -qF -- "$1"; }
