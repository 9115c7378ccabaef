#!/usr/bin/env python3
"""The soak's load generator, sampler and judge (scripts/soak.sh starts tandemd and runs it).

Python 3 standard library only: asyncio clients speak HTTP/1.1 over tandemd's Unix socket by
hand (soak_requests.py: the client, the request kinds and their checks). Phases: references (every deterministic request of the catalogue sent once, one at a
time, on the idle daemon), an idle snapshot, CLIENTS clients sending a weighted mix back to
back for MINUTES while a sampler reads /proc and /metrics every few seconds, a drain, a second
idle snapshot, then the goals. Writes DIR/samples.csv, DIR/result.json (everything
soak_report.py needs) and DIR/failures.txt; exits 1 when a hard goal fails.

Usage: soak.py --socket SOCK --pid PID --out DIR [--minutes N] [--clients C] [--seed S]
               [--latency-ratio R] [--max-requests N] [--sample-s S]
"""
import argparse
import asyncio
import csv
import json
import math
import os
import random
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from soak_requests import (catalogue, choices_of, connection, get_json, http_error, judge,  # noqa: E402
                           metrics, one_shot, outcome, perform, post_json, requests_by_route)

REQUEST_TIMEOUT_S = 180  # a request not answered by then is lost
IDLE_SETTLE_S = 30       # after the load: how long fds, threads and KV pages get to return to idle


# ---------------------------------------------------------------- /proc

def proc_tree(pid):
    """{name: pid} of the daemon and its worker processes (named by their --worker role)."""
    out = {"daemon": pid}
    kids = []
    try:
        for tid in os.listdir("/proc/{}/task".format(pid)):  # each thread lists the children it started
            with open("/proc/{}/task/{}/children".format(pid, tid)) as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    for kid in kids:
        try:
            with open("/proc/{}/cmdline".format(kid), "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        name = "child{}".format(kid)
        if b"--worker" in argv:
            i = argv.index(b"--worker")
            if i + 1 < len(argv):
                name = argv[i + 1].decode()
        out[name] = kid
    return out


def proc_stats(pid):
    """RSS, its shared-memory part (the KV pool), fds and threads of one process, or None when gone."""
    try:
        st = {}
        with open("/proc/{}/status".format(pid)) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssShmem", "RssAnon", "RssFile", "Threads"):
                    st[key] = int(rest.split()[0])
        fds = len(os.listdir("/proc/{}/fd".format(pid)))
        return {"rss_kb": st["VmRSS"], "shmem_kb": st.get("RssShmem", 0), "anon_kb": st.get("RssAnon", 0),
                "private_kb": st["VmRSS"] - st.get("RssShmem", 0), "fds": fds, "threads": st["Threads"]}
    except (OSError, KeyError):
        return None


def snapshot_procs(pid):
    return {name: proc_stats(p) for name, p in proc_tree(pid).items()}


def pct(values, q):
    """Nearest-rank percentile (q in 0..100), None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


# ---------------------------------------------------------------- the run

class soak:
    def __init__(self, args):
        self.a = args
        self.sock = args.socket
        self.rng = random.Random(args.seed)
        self.kinds = []
        self.refs = {}          # (kind, variant) -> reference
        self.done = []          # outcomes of the load phase
        self.failures = []      # (t, kind, variant, stream, why)
        self.samples = []
        self.sent = 0
        self.ids_seen = set()   # every response id of the load
        self.died = False       # the sampler saw the daemon or a worker gone
        self.stop_at = None
        self.t0 = None

    # the daemon's limits, and the references on the idle daemon
    async def setup(self):
        st = await get_json(self.sock, "/v1/tandem/status")
        models = await get_json(self.sock, "/v1/models")
        meta = models["data"][0].get("meta", {})
        lim = st["limits"]
        self.info = {"n_ctx": meta["n_ctx"], "n_vocab": meta["n_vocab"], "max_prompt_tokens": lim["max_prompt_tokens"],
                     "max_body_bytes": lim["max_body_bytes"], "max_tokens_limit": lim["max_tokens"],
                     "max_running": lim["max_running"], "kv_pages_total": st["kv_pages_total"],
                     "kv_page_size": st["kv_page_size"], "placement": st.get("placement"),
                     "model": models["data"][0]["id"]}
        self.kinds = catalogue(self.info)
        self.kind_by_name = {k.name: k for k in self.kinds}
        t = time.monotonic()
        conn = connection(self.sock)
        for k in self.kinds:
            if k.expect != 200 or not k.deterministic:
                continue
            for v in range(len(k.variants)):
                o = await perform(conn, k, v, False, 0)
                if o.error or o.status != 200:
                    raise SystemExit("soak: the reference for {} #{} failed: status {}, {} {!r}".format(
                        k.name, v, o.status, o.error, o.reply))
                if k.route == "/v1/embeddings":
                    self.refs[(k.name, v)] = {"vectors": [d["embedding"] for d in o.reply["data"]]}
                else:
                    self.refs[(k.name, v)] = {"choices": choices_of(o.reply, k.route)}
                    err = k.check(k.variants[v], o.reply | {"choices": [dict(c, index=i) for i, c in
                                                             self.refs[(k.name, v)]["choices"].items()]}) \
                        if k.check else None
                    if err:
                        raise SystemExit("soak: the idle daemon's reply to {} #{} fails its check: {}".format(
                            k.name, v, err))
        conn.drop()
        self.ref_seconds = time.monotonic() - t
        # speculation and plain decoding agree (greedy): the same prompt with and without drafts
        sp = self.kind_by_name["completion"]
        for v in range(2):
            body = dict(sp.variants[v])
            body["speculative"] = {"method": "off"} if "speculative" not in body else {"method": "ngram"}
            status, reply = await post_json(self.sock, "/v1/completions", body)
            want = self.refs[("completion", v)]["choices"][0]["text"]
            if status != 200 or reply["choices"][0]["text"] != want:
                raise SystemExit("soak: speculative decoding changes the greedy text of {!r}".format(body["prompt"]))
        await self.warm_lazy_paths(st)
        print("soak: {} references in {:.1f} s".format(len(self.refs), self.ref_seconds), file=sys.stderr)

    async def warm_lazy_paths(self, st):
        """What the workers build on first use, built before the idle baseline: a decode step of
        max_running x (1 + drafts) rows, 64 or more, runs on oneDNN, whose OpenMP threads start
        then (seen: the decode worker's threads 3 -> 4 and +1.9 MiB a minute into a run). One
        request of max_running prompts that share a cached prefix, each with that many tokens of
        its own, is such a step."""
        own = 1 + (st.get("speculative") or {}).get("draft_tokens", 0)
        page = self.info["kv_page_size"]
        prefix = [1] + [(i * 7) % (self.info["n_vocab"] - 40) + 30 for i in range(4 * page - 1)]
        prompts = [prefix + [(j * 11 + t) % (self.info["n_vocab"] - 40) + 30 for t in range(own)]
                   for j in range(self.info["max_running"])]
        for body in ({"prompt": [prefix], "max_tokens": 1}, {"prompt": prompts, "max_tokens": 2}):
            status, reply = await post_json(self.sock, "/v1/completions", dict(body, temperature=0))
            if status != 200:
                raise SystemExit("soak: the warm-up request failed: {} {!r}".format(status, reply))

    async def idle_snapshot(self):
        procs = snapshot_procs(self.a.pid)  # before this snapshot's own connection opens
        try:
            m = await metrics(self.sock)
        except (OSError, http_error, asyncio.IncompleteReadError):
            m = {}  # a dead daemon: every count unknown, every goal on them fails
        return {"procs": procs, "kv_pages_used": m.get("tandem_kv_pages_used"),
                "kv_pages_cached": m.get("tandem_kv_pages_cached"), "kv_tokens_stored": m.get("tandem_kv_tokens_stored"),
                "running": m.get("tandem_requests_running"), "waiting": m.get("tandem_requests_waiting"),
                "requests": requests_by_route(m), "metrics": m}

    # one client: requests back to back until the deadline
    async def client(self, cid):
        rng = random.Random(self.a.seed * 1000 + cid)
        conn = connection(self.sock)
        weights = [k.weight for k in self.kinds]
        while time.monotonic() < self.stop_at and self.sent < self.a.max_requests:
            self.sent += 1
            k = rng.choices(self.kinds, weights)[0]
            variant = rng.randrange(len(k.variants))
            stream = k.stream is not None and rng.random() < k.stream
            cancel_after = rng.randint(2, 12) if k.name == "cancel" else 0
            try:
                o = await asyncio.wait_for(perform(conn, k, variant, stream, cancel_after), REQUEST_TIMEOUT_S)
            except asyncio.TimeoutError:
                conn.drop()
                o = outcome(k.name, variant, stream, cancel_after)
                o.t_sent = o.t_first = o.t_done = time.monotonic()
                o.error = "no answer within {} s (lost)".format(REQUEST_TIMEOUT_S)
            why = judge(k, o, self.refs.get((k.name, variant)))
            for rid in o.ids:  # a reply seen twice (here, or on another connection) is a duplicate
                if rid in self.ids_seen:
                    why = why or "response id {} came twice".format(rid)
                self.ids_seen.add(rid)
            o.failed = why is not None
            if o.status is None:
                await asyncio.sleep(0.1)  # no daemon to answer: do not spin
            o.reply = None  # keep the memory flat over a long run
            o.choices = None
            self.done.append(o)
            if why:
                self.failures.append((round(o.t_sent - self.t0, 1), k.name, variant, stream, why))
        conn.drop()

    async def sampler(self):
        period = self.a.sample_s
        last = 0
        while True:
            t = time.monotonic()
            try:
                m = await metrics(self.sock)
            except (OSError, http_error, asyncio.IncompleteReadError) as e:
                m = {}
                self.failures.append((round(t - self.t0, 1), "sampler", 0, False, "/metrics: {}".format(e)))
            window = self.done[last:]
            last = len(self.done)
            gen = [o for o in window if o.status == 200 and not o.failed and not o.cancelled]
            ttft = [(o.t_first - o.t_sent) * 1000 for o in gen if o.stream]
            total = [(o.t_done - o.t_sent) * 1000 for o in gen]
            s = {"t": round(t - self.t0, 2), "procs": snapshot_procs(self.a.pid),
                 "kv_pages_used": m.get("tandem_kv_pages_used"), "kv_pages_cached": m.get("tandem_kv_pages_cached"),
                 "running": m.get("tandem_requests_running"), "waiting": m.get("tandem_requests_waiting"),
                 "preemptions": m.get("tandem_preemptions_total"), "worker_restarts": m.get("tandem_worker_restarts_total"),
                 "done": len(window), "failed": sum(o.failed for o in window),
                 "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
                 "total_p50_ms": pct(total, 50), "total_p99_ms": pct(total, 99),
                 "kinds": {}}
            for o in window:
                s["kinds"][o.kind] = s["kinds"].get(o.kind, 0) + 1
            self.samples.append(s)
            gone = [n for n, p in s["procs"].items() if p is None]
            if gone and not self.died:  # a crash: stop the load, judge what there is
                self.died = True
                self.failures.append((s["t"], "daemon", 0, False, "{} is gone (pid {})".format(
                    ", ".join(gone), self.a.pid if "daemon" in gone else "a worker's")))
                self.stop_at = t
            if t >= self.stop_at:
                return
            await asyncio.sleep(max(0.1, period - (time.monotonic() - t)))

    async def wait_idle(self, before=None):
        """Polls every 0.5 s until the daemon is idle and its counts are back to `before`'s, or, without
        `before`, the same twice in a row; gives up after IDLE_SETTLE_S. Returns the last snapshot."""
        def counts(snap):
            return ({n: (p["fds"], p["threads"]) if p else None for n, p in snap["procs"].items()},
                    snap["kv_pages_used"], snap["kv_tokens_stored"], snap["running"], snap["waiting"])
        deadline = time.monotonic() + IDLE_SETTLE_S
        last = None
        while True:
            snap = await self.idle_snapshot()
            idle = snap["running"] == 0 and snap["waiting"] == 0
            want = counts(before) if before else (counts(last) if last else None)
            if (idle and counts(snap) == want) or time.monotonic() > deadline:
                return snap
            last = snap
            await asyncio.sleep(0.5)

    async def wait_ready(self):
        """Until /health answers 200 (the model is loaded); exits 2 if the daemon dies or takes 2 minutes."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if (await one_shot(self.sock, "GET", "/health"))[0] == 200:
                    return
            except (OSError, http_error, asyncio.IncompleteReadError):
                pass
            if proc_stats(self.a.pid) is None:
                break
            await asyncio.sleep(0.1)
        raise SystemExit("soak: tandemd did not get ready")

    async def run(self):
        self.load_average = "{:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())  # the machine's, as we start
        await self.wait_ready()
        await self.setup()
        self.before = await self.wait_idle()  # the references' connections closed, all steady
        self.t0 = time.monotonic()
        self.stop_at = self.t0 + self.a.minutes * 60
        sampler = asyncio.create_task(self.sampler())
        await asyncio.gather(*[self.client(i) for i in range(self.a.clients)])
        self.load_s = time.monotonic() - self.t0
        self.stop_at = time.monotonic()
        await sampler
        t = time.monotonic()
        self.after = await self.wait_idle(self.before) if not self.died else await self.idle_snapshot()
        self.settle_s = time.monotonic() - t


# ---------------------------------------------------------------- goals

def goals(s):
    """[{name, ok, hard, measured, bound}] from a finished run."""
    out = []
    a = s.a
    T = s.load_s
    warm = min(300.0, 0.2 * T)          # warm-up: 20% of the run, at most 5 minutes
    win = warm                          # the latency windows: as long as the warm-up
    steady = [x for x in s.samples if x["t"] >= warm]

    def goal(name, ok, measured, bound, hard=True):
        out.append({"name": name, "ok": bool(ok), "hard": hard, "measured": measured, "bound": bound})

    n = len(s.done)
    lost = sum(1 for o in s.done if o.error and ("lost" in o.error or o.status is None))
    goal("every request answered correctly", not s.failures and n > 0,
         "{} requests, {} failed ({} without an answer)".format(n, len(s.failures), lost), "0 failed")

    # the daemon's own count of each reply equals ours: none lost, none duplicated
    routes = {k.route for k in s.kinds} | {"other"}
    ours = {}
    for o in s.done:
        if o.status is None:
            continue
        st = 499 if o.cancelled else o.status
        r = s.kind_by_name[o.kind].route if st != 413 else "other"  # refused before routing
        ours[(r, st)] = ours.get((r, st), 0) + 1
    b, e = s.before["requests"], s.after["requests"]
    theirs = {key: e[key] - b.get(key, 0) for key in e if key[0] in routes and e[key] != b.get(key, 0)}
    # a stream we closed may have finished (200) before the daemon saw us go: count the pair together
    def fold(d):
        f = {}
        for (r, st), v in d.items():
            key = (r, 200 if st in (200, 499) else st)
            f[key] = f.get(key, 0) + v
        return f
    mismatch = {"{} {}".format(*k): (fold(ours).get(k, 0), fold(theirs).get(k, 0))
                for k in set(fold(ours)) | set(fold(theirs)) if fold(ours).get(k, 0) != fold(theirs).get(k, 0)}
    goal("the daemon counted every reply once (tandem_requests_total)", not mismatch,
         "match" if not mismatch else "ours/daemon's: {}".format(mismatch), "equal per route and status")

    ran = {o.kind for o in s.done if not o.failed}
    missing = [k.name for k in s.kinds if k.name not in ran]
    pre = (s.after["metrics"].get("tandem_preemptions_total", 0) - s.before["metrics"].get("tandem_preemptions_total", 0))
    cancels = sum(1 for o in s.done if o.cancelled)
    goal("every kind of request ran; the load preempted", not missing and pre > 0 and cancels > 0,
         "{} kinds, {} preemptions, {} cancelled streams{}".format(len(ran), int(pre), cancels,
                                                                   ", missing: " + ", ".join(missing) if missing else ""),
         "all kinds, preemptions > 0")

    restarts = (s.after["metrics"].get("tandem_worker_restarts_total", 0)
                - s.before["metrics"].get("tandem_worker_restarts_total", 0))
    gone = [n for n, p in s.after["procs"].items() if p is None] + \
           [n for n in s.before["procs"] if n not in s.after["procs"]]
    goal("no process died", restarts == 0 and not gone,
         "{} worker restarts{}".format(int(restarts), ", gone: " + ", ".join(gone) if gone else ""), "0")

    # RSS less its shared-memory part (the KV pool, mapped by all three), per process, after warm-up
    rss_rows = []
    ok = True
    first = [x for x in steady if x["t"] < warm + win]
    last = [x for x in steady if x["t"] >= T - win]
    for name in s.before["procs"]:
        def peak(rows):
            v = [x["procs"][name]["private_kb"] for x in rows if x["procs"].get(name)]
            return max(v) if v else None
        p0, p1 = peak(first), peak(last)
        if p0 is None or p1 is None:
            ok = False
            rss_rows.append("{}: no samples".format(name))
            continue
        growth = (p1 - p0) / p0
        ok = ok and growth < 0.05
        rss_rows.append("{} {:.1f} -> {:.1f} MiB ({:+.1f}%)".format(name, p0 / 1024, p1 / 1024, 100 * growth))
    goal("RSS growth after warm-up under 5%", ok, "; ".join(rss_rows), "< 5% per process", hard=a.rss_hard)

    for what in ("fds", "threads"):
        rows, ok = [], True
        for name, p0 in s.before["procs"].items():
            p1 = s.after["procs"].get(name)
            v0, v1 = p0[what] if p0 else None, p1[what] if p1 else None
            during = [x["procs"][name][what] for x in steady if x["procs"].get(name)]
            ok = ok and v0 is not None and v0 == v1
            rows.append("{} {} -> {} (load: {}-{})".format(name, v0, v1, min(during) if during else "?",
                                                          max(during) if during else "?"))
        goal("{} flat: idle before the load = idle after it".format("open fds" if what == "fds" else "threads"),
             ok, "; ".join(rows), "equal (0 tolerance)")

    def window_p99(lo, hi, f):
        v = [f(o) for o in s.done if lo <= o.t_sent - s.t0 < hi and o.status == 200 and not o.failed
             and not o.cancelled]
        return pct([x for x in v if x is not None], 99), len(v)
    rows, ok = [], True
    for label, f in (("total", lambda o: (o.t_done - o.t_sent) * 1000),
                     ("TTFT", lambda o: (o.t_first - o.t_sent) * 1000 if o.stream else None)):
        p0, n0 = window_p99(warm, warm + win, f)
        p1, n1 = window_p99(T - win, T + 1, f)
        if p0 and p1:
            ratio = p1 / p0
            ok = ok and ratio <= a.latency_ratio
            rows.append("{} P99 {:.0f} -> {:.0f} ms ({:.2f}x; {} and {} requests)".format(label, p0, p1, ratio, n0, n1))
        else:
            ok = False
            rows.append("{}: no requests in a window".format(label))
    goal("P99 latency stable: last window / first window after warm-up", ok, "; ".join(rows),
         "<= {:g}x".format(a.latency_ratio), hard=a.latency_ratio_hard)

    kv_ok = (s.after["kv_pages_used"] == s.before["kv_pages_used"] and s.after["running"] == 0
             and s.after["waiting"] == 0 and s.after["kv_tokens_stored"] == s.before["kv_tokens_stored"])
    goal("KV pages back to idle after the load", kv_ok,
         "pages used {} -> {}, tokens stored {} -> {}, prefix cache keeps {} -> {} free pages, "
         "running {}, waiting {} ({:.1f} s after the load)".format(*[
             "?" if v is None else int(v) for v in (
                 s.before["kv_pages_used"], s.after["kv_pages_used"], s.before["kv_tokens_stored"],
                 s.after["kv_tokens_stored"], s.before["kv_pages_cached"], s.after["kv_pages_cached"],
                 s.after["running"], s.after["waiting"])], s.settle_s),
         "pages used and tokens stored = idle before; nothing running or waiting")
    return out, warm, win


def write_outputs(s, out_dir):
    g, warm, win = goals(s)
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(s.before["procs"])
    with open(os.path.join(out_dir, "samples.csv"), "w", newline="") as f:
        w = csv.writer(f)
        cols = ["t_s"]
        for n in names:
            cols += ["{}_{}".format(n, c) for c in ("rss_kb", "private_kb", "shmem_kb", "fds", "threads")]
        cols += ["kv_pages_used", "kv_pages_cached", "running", "waiting", "preemptions", "done", "failed",
                 "ttft_p50_ms", "ttft_p99_ms", "total_p50_ms", "total_p99_ms"]
        w.writerow(cols)
        for x in s.samples:
            row = [x["t"]]
            for n in names:
                p = x["procs"].get(n) or {}
                row += [p.get(c) for c in ("rss_kb", "private_kb", "shmem_kb", "fds", "threads")]
            row += [x[c] for c in cols[1 + 5 * len(names):]]
            w.writerow(row)
    per_kind = {}
    for o in s.done:
        d = per_kind.setdefault(o.kind, {"requests": 0, "failed": 0, "streamed": 0, "cancelled": 0})
        d["requests"] += 1
        d["failed"] += o.failed
        d["streamed"] += o.stream
        d["cancelled"] += o.cancelled
    gen = [o for o in s.done if o.status == 200 and not o.failed and not o.cancelled]
    result = {
        "load_average": s.load_average, "minutes": s.a.minutes, "clients": s.a.clients, "seed": s.a.seed, "sample_s": s.a.sample_s,
        "latency_ratio": s.a.latency_ratio, "daemon": s.info, "references": len(s.refs),
        "reference_s": round(s.ref_seconds, 1), "load_s": round(s.load_s, 1), "settle_s": round(s.settle_s, 1),
        "warmup_s": round(warm, 1), "window_s": round(win, 1), "requests": len(s.done),
        "failed": len(s.failures), "kinds": per_kind,
        "latency_ms": {"ttft_p50": pct([(o.t_first - o.t_sent) * 1000 for o in gen if o.stream], 50),
                       "ttft_p99": pct([(o.t_first - o.t_sent) * 1000 for o in gen if o.stream], 99),
                       "total_p50": pct([(o.t_done - o.t_sent) * 1000 for o in gen], 50),
                       "total_p99": pct([(o.t_done - o.t_sent) * 1000 for o in gen], 99)},
        "idle_before": {k: v for k, v in s.before.items() if k not in ("metrics", "requests")},
        "idle_after": {k: v for k, v in s.after.items() if k not in ("metrics", "requests")},
        "goals": g, "samples": s.samples,
        "failures": [list(f) for f in s.failures[:200]],
    }
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out_dir, "failures.txt"), "w") as f:
        for t, kname, v, stream, why in s.failures:
            f.write("{:8.1f} s  {} #{}{}: {}\n".format(t, kname, v, " (stream)" if stream else "", why))
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--pid", type=int, required=True, help="tandemd's pid (its workers are found as its children)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sample-s", type=float, default=5)
    ap.add_argument("--max-requests", type=int, default=2_000_000)
    ap.add_argument("--latency-ratio", type=float, default=1.5)
    ap.add_argument("--latency-soft", dest="latency_ratio_hard", action="store_false",
                    help="report the latency goal, do not fail on it")
    ap.add_argument("--rss-soft", dest="rss_hard", action="store_false",
                    help="report the RSS goal, do not fail on it (a run too short for its warm-up to reach steady state)")
    a = ap.parse_args()
    s = soak(a)
    asyncio.run(s.run())
    g = write_outputs(s, a.out)
    bad = 0
    for x in g:
        mark = "ok  " if x["ok"] else ("FAIL" if x["hard"] else "warn")
        print("soak: {} {}: {} (bound: {})".format(mark, x["name"], x["measured"], x["bound"]), file=sys.stderr)
        bad += x["hard"] and not x["ok"]
    for f in s.failures[:10]:
        print("soak: failure at {} s: {} #{}{}: {}".format(f[0], f[1], f[2], " (stream)" if f[3] else "", f[4]),
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
