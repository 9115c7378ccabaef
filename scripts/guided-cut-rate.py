#!/usr/bin/env python3
"""How often a weak model at temperature 1 runs out of tokens under a JSON Schema.

For a sample of the MaskBench development set's schemas (every Nth one that `tandem guide
compile` accepts), runs `tandem run -m MODEL --json-schema S.json --temp 1 -n 384` a few times
and reports the share of runs cut by the token limit (finish_reason "length"); each finished
reply is parsed as JSON and, where Debian's python3-jsonschema is installed, validated against
its schema. Not part of the test suite: it takes minutes.

Usage: scripts/guided-cut-rate.py [--tandem build/daemon/tandem] [--model ../shared/models/stories260K.gguf]
         [--data ../shared/data/maskbench-dev.json] [--every 9] [--runs 2] [--max-tokens 384]
         [--whitespace bounded|compact] [--closed-objects]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import jsonschema  # Debian: python3-jsonschema
except ImportError:
    jsonschema = None


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tandem", default=os.path.join(root, "build/daemon/tandem"))
    ap.add_argument("--model", default=os.path.join(root, "../shared/models/stories260K.gguf"))
    ap.add_argument("--data", default=os.path.join(root, "../shared/data/maskbench-dev.json"))
    ap.add_argument("--every", type=int, default=9, help="take every Nth schema")
    ap.add_argument("--runs", type=int, default=2, help="runs per schema (seeds 1..N)")
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--whitespace", default="bounded", choices=["bounded", "compact"])
    ap.add_argument("--closed-objects", action="store_true", help="tandem run --closed-objects")
    a = ap.parse_args()

    entries = json.load(open(a.data))[:: a.every]
    n_runs = n_cut = n_finished = n_invalid = n_refused = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "schema.json")
        for e in entries:
            with open(path, "w") as f:
                json.dump(e["schema"], f)
            if subprocess.run([a.tandem, "guide", "compile", path], capture_output=True).returncode != 0:
                n_refused += 1
                continue
            for seed in range(1, a.runs + 1):
                out = subprocess.run([a.tandem, "run", "-m", a.model, "--json-schema", path, "--whitespace",
                                      a.whitespace, "--temp", "1", "-n", str(a.max_tokens), "--seed", str(seed),
                                      "-p", "Once upon a time", "--json"] + (["--closed-objects"] if a.closed_objects else []),
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"{e['id']}: tandem run failed: {out.stderr.strip()}", file=sys.stderr)
                    continue
                r = json.loads(out.stdout)
                n_runs += 1
                if r["finish_reason"] == "length":
                    n_cut += 1
                    continue
                n_finished += 1
                try:
                    value = json.loads(r["text"])
                    if jsonschema is not None:
                        jsonschema.validators.validator_for(e["schema"])(e["schema"]).validate(value)
                except Exception as ex:  # not JSON, or not valid under the schema
                    n_invalid += 1
                    print(f"{e['id']} seed {seed}: invalid reply: {str(ex)[:200]}", file=sys.stderr)
    print(json.dumps({"schemas": len(entries), "refused": n_refused, "runs": n_runs, "cut_by_max_tokens": n_cut,
                      "cut_share": n_cut / n_runs if n_runs else 0, "finished": n_finished,
                      "finished_invalid": n_invalid, "validated_with_jsonschema": jsonschema is not None,
                      "max_tokens": a.max_tokens, "whitespace": a.whitespace, "closed_objects": a.closed_objects},
                     indent=1))


if __name__ == "__main__":
    main()
