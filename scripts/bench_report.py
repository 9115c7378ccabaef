#!/usr/bin/env python3
"""Turns `tandem bench --serve --json` results into docs/performance.md and a hand-written SVG chart.

Python 3 standard library only. Usage (scripts/bench-serve.sh calls it):
  bench_report.py --md OUT.md --svg OUT.svg --script-cmd CMD [--note TEXT]
                  --run NAME RESULT.json DAEMON_CMD BENCH_CMD [--run ...]
"""
import argparse
import datetime
import html
import json
import math
import os
import platform
import subprocess


def machine_description():
    cpu = "unknown CPU"
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and cpu == "unknown CPU":
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [x for x in ("avx2", "avx512f", "avx512_vnni", "amx_int8") if x in flags]
    mem_gib = 0.0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    distro = ""
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    distro = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    short = "{} ({} cores), {:.0f} GiB RAM".format(cpu, os.cpu_count(), mem_gib)
    full = "{} ({} cores visible{}), {:.0f} GiB RAM, {}, Linux {}".format(
        cpu, os.cpu_count(), ", " + " ".join(isa) if isa else "", mem_gib, distro or platform.platform(),
        platform.release())
    return short, full


def git_commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def fmt_ms(v):
    if v is None:
        return "–"
    if v >= 100:
        return "{:.0f}".format(v)
    if v >= 10:
        return "{:.1f}".format(v)
    if v >= 1:
        return "{:.2f}".format(v)
    return "{:.3f}".format(v)


def fmt_pct(v):
    return "–" if v is None else "{:.0f}%".format(100 * v)


def markdown(runs, args, machine, date, commit, load):
    out = []
    w = out.append
    w("# Serving performance")
    w("")
    w("`tandem bench --serve` against a running `tandemd`, written by `scripts/bench-serve.sh` "
      "(regenerate it with that script; this page and `performance.svg` are its output).")
    w("")
    w("- Date: {}".format(date))
    w("- Machine: {}".format(machine))
    w("- Load average when the run started: {} (1, 5, 15 min)".format(load))
    w("- Commit: {}".format(commit))
    w("- Command: `{}`".format(args.script_cmd))
    if args.note:
        w("- Conditions: {}".format(args.note))
    w("")
    w("Each concurrency level runs C client threads, each sending streaming `/v1/completions` requests "
      "back to back (prompts of random token ids, distinct per request so the prefix cache cannot help; "
      "`temperature` 0 and `ignore_eos`, so every request generates exactly `max_tokens`; `logprobs: 0` so "
      "that every token is an event of its own). The client runs on the same machine as the daemon.")
    w("")
    w("- **tok/s**: generated tokens of the level over its wall time (first request sent to last reply done).")
    w("- **TTFT**: request sent to its first token event, queueing included (the daemon batches at most "
      "`max_running` sequences; the rest wait).")
    w("- **ITL**: gaps between consecutive token events of one stream, over all streams.")
    w("- **KV waste**: from `/v1/tandem/status` sampled while the level runs: page slots allocated "
      "(`kv_pages_used × kv_page_size`) minus tokens stored (`kv_tokens_stored`), over slots allocated, summed "
      "over the samples (mean) and the worst sample (max). Pages are taken as positions are computed (a "
      "batch's positions count as stored while it writes them), so what is left is the unused tail of each "
      "sequence's last page: about half a page per sequence, 8 of 16 slots, whatever else runs.")
    w("- **Prefix TTFT**: one request with a long random prompt (cold), then one with the same prefix and "
      "another 16-token suffix (warm); `reused` is the change of `prefix_cache_hit_tokens` across the warm "
      "request: the warm one computes only the suffix (and the last, partly shared page).")
    w("")
    w("Reading the numbers: at concurrency above `max_running`, TTFT is mostly time spent waiting for a "
      "slot. With the worker split (the default) prompts are computed by the prefill worker while the "
      "decode worker keeps stepping, so a long prompt no longer stalls the streams already decoding; on "
      "these 2 cores the two workers share the cores, so a busy prefill still slows decode steps. The "
      "`-local` run is the same daemon computing in one process (`placement = local`), for comparison.")
    w("")
    for r in runs:
        j = r["result"]
        w("## {}".format(r["name"]))
        w("")
        w("Model `{}` (n_ctx {}, n_vocab {}), {} daemon threads, placement {}, `max_running` {}, "
          "KV page {} tokens; prompts of {} tokens, {} generated per request.".format(
              j["model"], j["n_ctx"], j["n_vocab"], j["threads"],
              "prefill={} decode={}".format(j["placement"].get("prefill"), j["placement"].get("decode"))
              if isinstance(j.get("placement"), dict) else j.get("placement"),
              j["max_running"], j["kv_page_size"], j["prompt_tokens"], j["max_tokens"]))
        w("")
        w("- Daemon: `{}`".format(r["daemon_cmd"]))
        w("- Bench: `{}`".format(r["bench_cmd"]))
        w("")
        w("| concurrency | requests | aggregate tok/s | TTFT P50 / P99 (ms) | ITL P50 / P99 (ms) | KV waste mean / max |")
        w("|---:|---:|---:|---:|---:|---:|")
        for l in j["levels"]:
            err = " ({} failed)".format(l["errors"]) if l["errors"] else ""
            w("| {} | {}{} | {:.1f} | {} / {} | {} / {} | {} / {} |".format(
                l["concurrency"], l["requests"], err, l["tok_s"],
                fmt_ms(l["ttft_ms"]["p50"]), fmt_ms(l["ttft_ms"]["p99"]),
                fmt_ms(l["itl_ms"]["p50"]), fmt_ms(l["itl_ms"]["p99"]),
                fmt_pct(l.get("kv_waste")), fmt_pct(l.get("kv_waste_max"))))
        w("")
        p = j.get("prefix")
        if p and "error" not in p:
            w("Prefix TTFT ({} shared + {} distinct tokens): cold {} ms, warm {} ms ({:.2f}x); "
              "{} prompt tokens reused.".format(p["prefix_tokens"], p["suffix_tokens"], fmt_ms(p["cold_ttft_ms"]),
                                               fmt_ms(p["warm_ttft_ms"]), p["speedup"], p["warm_hit_tokens"]))
        elif p:
            w("Prefix test failed: {}".format(p["error"]))
        w("")
    w("![throughput and P99 latency against concurrency](performance.svg)")
    w("")
    return "\n".join(out)


COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]


def log_ticks(lo, hi):
    """Decade ticks (1, 2, 5 per decade when there are few decades) covering [lo, hi]."""
    lo_e, hi_e = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    steps = (1, 2, 5) if hi_e - lo_e <= 3 else (1,)
    ticks = []
    for e in range(lo_e, hi_e + 1):
        for s in steps:
            v = s * 10 ** e
            if lo <= v <= hi:
                ticks.append(v)
    return ticks


def tick_label(v):
    if v >= 1000:
        return "{:g}k".format(v / 1000)
    return "{:g}".format(v)


def axes(x0, y0, w, h, title, xlabel, ylabel, yticks, xticks):
    """A panel's title, frame, grid and labels; yticks and xticks: [(pixel, label)]. Returns SVG elements."""
    els = ['<text x="{:.1f}" y="{:.1f}" class="title">{}</text>'.format(x0 + w / 2, y0 - 14, html.escape(title)),
           '<rect x="{}" y="{}" width="{}" height="{}" class="frame"/>'.format(x0, y0, w, h)]
    for y, label in yticks:
        els.append('<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" class="grid"/>'.format(x0, y, x0 + w, y))
        els.append('<text x="{}" y="{:.1f}" class="ytick">{}</text>'.format(x0 - 6, y + 4, label))
    for x, label in xticks:
        els.append('<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" class="grid"/>'.format(x, y0, x, y0 + h))
        els.append('<text x="{:.1f}" y="{}" class="xtick">{}</text>'.format(x, y0 + h + 16, label))
    els.append('<text x="{:.1f}" y="{}" class="axis">{}</text>'.format(x0 + w / 2, y0 + h + 34, html.escape(xlabel)))
    els.append('<text transform="translate({},{:.1f}) rotate(-90)" class="axis">{}</text>'.format(
        x0 - 46, y0 + h / 2, html.escape(ylabel)))
    return els


def panel(x0, y0, w, h, title, ylabel, xs_all, series):
    """One log-log panel. series: [(label, colour, dashed, [(x, y)])]. Returns SVG elements."""
    els = []
    values = [y for _, _, _, pts in series for _, y in pts if y and y > 0]
    if not values:
        values = [1]
    lo = 10 ** math.floor(math.log10(min(values)))
    hi = 10 ** math.ceil(math.log10(max(values)))
    if hi <= lo:
        hi = lo * 10
    xs = sorted(set(xs_all))
    lx = [math.log2(x) for x in xs]
    xmin, xmax = min(lx), max(lx)
    if xmax == xmin:
        xmin, xmax = xmin - 1, xmax + 1

    def px(x):
        return x0 + (math.log2(x) - xmin) / (xmax - xmin) * w

    def py(y):
        return y0 + h - (math.log10(y) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * h

    els += axes(x0, y0, w, h, title, "concurrent clients", ylabel, [(py(t), tick_label(t)) for t in log_ticks(lo, hi)],
                [(px(x), x) for x in xs])
    for label, colour, dashed, pts in series:
        pts = [(x, y) for x, y in pts if y and y > 0]
        if not pts:
            continue
        path = " ".join("{:.1f},{:.1f}".format(px(x), py(y)) for x, y in pts)
        dash = ' stroke-dasharray="6,4"' if dashed else ""
        els.append('<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{}/>'.format(path, colour, dash))
        for x, y in pts:
            els.append('<circle cx="{:.1f}" cy="{:.1f}" r="3.5" fill="{}"><title>{}: {:.4g} at {}</title></circle>'.format(
                px(x), py(y), colour, html.escape(label), y, x))
    return els


def svg(runs, date, machine):
    width, height = 980, 470
    els = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" '
        'font-family="sans-serif" font-size="12">'.format(width, height),
        "<style>.title{font-size:14px;font-weight:bold;text-anchor:middle}.frame{fill:none;stroke:#444}"
        ".grid{stroke:#ddd}.ytick{text-anchor:end;fill:#333}.xtick{text-anchor:middle;fill:#333}"
        ".axis{text-anchor:middle;fill:#333}.legend{fill:#222}.small{font-size:11px;fill:#555}</style>",
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    xs = [l["concurrency"] for r in runs for l in r["result"]["levels"]]
    thr, lat = [], []
    for i, r in enumerate(runs):
        c = COLOURS[i % len(COLOURS)]
        levels = r["result"]["levels"]
        thr.append((r["name"], c, False, [(l["concurrency"], l["tok_s"]) for l in levels]))
        lat.append((r["name"] + " TTFT P99", c, False, [(l["concurrency"], l["ttft_ms"]["p99"]) for l in levels]))
        lat.append((r["name"] + " ITL P99", c, True, [(l["concurrency"], l["itl_ms"]["p99"]) for l in levels]))
    els += panel(80, 50, 360, 300, "Aggregate generated tokens/s", "tokens/s (log)", xs, thr)
    els += panel(580, 50, 360, 300, "P99 latency", "milliseconds (log)", xs, lat)
    # legend
    y = 410
    x = 80
    for i, r in enumerate(runs):
        c = COLOURS[i % len(COLOURS)]
        els.append('<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="2"/>'.format(x, y, x + 24, y, c))
        els.append('<text x="{}" y="{}" class="legend">{}</text>'.format(x + 30, y + 4, html.escape(r["name"])))
        x += 40 + 8 * len(r["name"])
    els.append('<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#444" stroke-width="2"/>'.format(x, y, x + 24, y))
    els.append('<text x="{}" y="{}" class="legend">TTFT P99</text>'.format(x + 30, y + 4))
    x += 110
    els.append('<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#444" stroke-width="2" stroke-dasharray="6,4"/>'.format(
        x, y, x + 24, y))
    els.append('<text x="{}" y="{}" class="legend">ITL P99 (right panel)</text>'.format(x + 30, y + 4))
    els.append('<text x="80" y="445" class="small">{} · {}</text>'.format(html.escape(date), html.escape(machine)))
    els.append('<text x="80" y="462" class="small">tandem bench --serve: streaming /v1/completions, greedy, '
               'ignore_eos; TTFT includes queueing.</text>')
    els.append("</svg>")
    return "\n".join(els) + "\n"


KEEP_MARKER = "<!-- Below: other benchmarks' figures, written by hand; bench_report.py keeps them. -->"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--md", required=True)
    ap.add_argument("--svg", required=True)
    ap.add_argument("--script-cmd", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("--load", default="", help="load average at the start (default: now)")
    ap.add_argument("--run", nargs=4, action="append", required=True,
                    metavar=("NAME", "RESULT_JSON", "DAEMON_CMD", "BENCH_CMD"))
    args = ap.parse_args()
    runs = []
    for name, path, daemon_cmd, bench_cmd in args.run:
        with open(path) as f:
            runs.append({"name": name, "result": json.load(f), "daemon_cmd": daemon_cmd, "bench_cmd": bench_cmd})
    machine_short, machine = machine_description()
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    load = args.load or "{:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())
    # Sections measured by other benchmarks (guided generation, ...) follow KEEP_MARKER in the
    # page; they are kept as they are.
    kept = ""
    if os.path.exists(args.md):
        with open(args.md) as f:
            old = f.read()
        if KEEP_MARKER in old:
            kept = "\n" + old[old.index(KEEP_MARKER):]
    with open(args.md, "w") as f:
        f.write(markdown(runs, args, machine, date, git_commit(), load) + kept)
    with open(args.svg, "w") as f:
        f.write(svg(runs, date, machine_short))


if __name__ == "__main__":
    main()
