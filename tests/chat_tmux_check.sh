#!/usr/bin/env bash
# `tandem chat` on a real terminal (a detached tmux session) against tests/fake_tandemd: the
# line is edited with the arrow keys (no escape sequences reach the daemon), Up recalls earlier
# lines, the history file is private, Ctrl-C at an empty prompt says how to leave and Ctrl-C
# during a reply stops it and keeps the chat.
# usage: chat_tmux_check.sh TANDEM FAKE_TANDEMD
set -euo pipefail
tandem="$1" fake="$2"
session=chat
. "$(dirname "$0")/tmux_common.sh"
sock="$tmp/d.sock" log="$tmp/requests.jsonl" state="$tmp/state"
fake_pid=
trap 'tmux kill-server 2>/dev/null || true; [ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT

"$fake" "$sock" "$log" &
fake_pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
touch "$log"

on_fail() {
  echo "--- the requests:"
  cat "$log"
}
n_requests() { wc -l <"$log"; }
has_requests() { [ "$(n_requests)" -ge "$1" ]; }
# The last message of request N (from 1), as the daemon got it.
sent() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[int(sys.argv[2]) - 1])["messages"][-1]["content"])' "$log" "$1"; }

tmux -f /dev/null new-session -d -s "$session" -x 100 -y 40 \
  "env XDG_STATE_HOME='$state' '$tandem' chat --socket '$sock'; echo \"chat exited: \$?\"; sleep 60"
wait_for "the chat's banner" pane_has "tandem chat on $sock"

# Type "helo world", move back 7 characters, insert the missing "l".
tmux send-keys -t "$session" -l "helo world"
tmux send-keys -t "$session" Left Left Left Left Left Left Left
tmux send-keys -t "$session" -l "l"
tmux send-keys -t "$session" Enter
wait_for "the first request" has_requests 1
[ "$(sent 1)" = "hello world" ] || fail "the edited line was sent as '$(sent 1)', not 'hello world'"
wait_for "the first reply" pane_has "echo: hello world"

tmux send-keys -t "$session" -l "second"
tmux send-keys -t "$session" Enter
wait_for "the second request" has_requests 2
wait_for "the second reply" pane_has "echo: second"

# Up twice: the line before the last one, sent again as it was.
tmux send-keys -t "$session" Up Up Enter
wait_for "the third request" has_requests 3
[ "$(sent 3)" = "hello world" ] || fail "Up Up sent '$(sent 3)', not the first line"

if grep -q $'\x1b' "$log" || grep -qF '[D' "$log" || grep -qF '[A' "$log"; then fail "escape sequences reached the daemon"; fi
echo "ok: Left arrows edit the line, Up recalls history, nothing but the text is sent"

hist="$state/tandem/history"
[ -f "$hist" ] || fail "no history file at $hist"
[ "$(stat -c %a "$hist")" = 600 ] || fail "the history file's mode is $(stat -c %a "$hist"), not 600"
grep -qF second "$hist" || fail "the history file lacks the lines typed"
echo "ok: history in \$XDG_STATE_HOME/tandem/history, mode 600"

# Ctrl-C at an empty prompt says how to leave, and leaves nothing sent.
tmux send-keys -t "$session" C-c
wait_for "the hint after Ctrl-C" pane_has "(type /quit or press Ctrl-D to leave)"
[ "$(n_requests)" = 3 ] || fail "Ctrl-C sent a request"
echo "ok: Ctrl-C at the prompt says how to leave"

# Ctrl-C during a streamed reply stops it; the chat goes on.
tmux send-keys -t "$session" -l "slow"
tmux send-keys -t "$session" Enter
wait_for "the slow reply's first ticks" pane_has "tick tick"
tmux send-keys -t "$session" C-c
tmux send-keys -t "$session" -l "after"
tmux send-keys -t "$session" Enter
wait_for "a reply after the interrupted one" pane_has "echo: after"
[ "$(sent 5)" = "after" ] || fail "the request after Ctrl-C was '$(sent 5)'"
echo "ok: Ctrl-C stops a reply and returns to the prompt"

tmux send-keys -t "$session" C-d
wait_for "the chat to end on Ctrl-D with exit code 0" pane_has "chat exited: 0"
echo "ok: Ctrl-D ends the chat (exit 0)"
