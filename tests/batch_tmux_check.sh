#!/usr/bin/env bash
# `tandem batch` on a real terminal (a detached tmux session), in-process on stories260K: the
# progress line is drawn in place and ends at every line done, the summary follows, and the
# output file holds every custom_id once.
# usage: batch_tmux_check.sh TANDEM MODEL
set -euo pipefail
tandem="$1" model="$2"
session=batch
. "$(dirname "$0")/tmux_common.sh"
trap 'tmux kill-server 2>/dev/null || true; rm -rf "$tmp"' EXIT

n=48
python3 - "$tmp/in.jsonl" "$n" <<'PY'
import json, sys
with open(sys.argv[1], 'w') as f:
    for i in range(int(sys.argv[2])):
        body = {'prompt': f'Once upon a time {i}', 'max_tokens': 48, 'ignore_eos': True, 'temperature': 0}
        f.write(json.dumps({'custom_id': f'r{i}', 'method': 'POST', 'url': '/v1/completions', 'body': body}) + '\n')
PY
tmux -f /dev/null new-session -d -s "$session" -x 120 -y 20 \
  "'$tandem' batch '$tmp/in.jsonl' -o '$tmp/out.jsonl' -m '$model' -t 1 --max-running 2 --concurrency 2; \
   echo \"batch exited: \$?\"; sleep 60"
wait_s=60 wait_for "the batch to end with exit code 0" pane_has "batch exited: 0"
pane="$(tmux capture-pane -p -t "$session")"
grep -qE "^\[#{24}\] $n/$n done, 0 errors, [0-9]+ tok/s, ETA" <<<"$pane" || fail "no finished progress line"
grep -qF "tandem batch: $n lines: $n answered, 0 errors" <<<"$pane" || fail "no summary"
[ "$(grep -c 'done, ' <<<"$pane")" = 1 ] || fail "the progress line was not redrawn in place"
python3 - "$tmp/out.jsonl" "$n" <<'PY' || fail "the output file does not hold every custom_id once"
import collections, json, sys
ids = collections.Counter(json.loads(l)['custom_id'] for l in open(sys.argv[1]))
sys.exit(0 if len(ids) == int(sys.argv[2]) and set(ids.values()) == {1} else 1)
PY
echo "ok: the progress line ends at $n/$n, the summary follows, every line answered once"
