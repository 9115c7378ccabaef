#!/usr/bin/env python3
"""Turns a soak's result.json (scripts/soak.py) into a markdown summary and a hand-written SVG plot.

Python 3 standard library only. Usage (scripts/soak.sh calls it):
  soak_report.py --result DIR/result.json --md DIR/report.md --svg DIR/soak.svg --command CMD
                 [--daemon-exit CODE] [--daemon-log LOG] [--docs-md docs/reliability.md --svg-link soak.svg]
With --docs-md, the results block of that page's "## Soak" section (between the two markers
below) is replaced by the summary.
"""
import argparse
import datetime
import html
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from bench_report import axes, git_commit, machine_description  # noqa: E402  (performance.md's facts and frames)

BEGIN = "<!-- soak results: written by scripts/soak.sh --docs; edit the text around them, not them -->"
END = "<!-- end of soak results -->"


def fmt(v, unit=""):
    if v is None:
        return "–"
    if v >= 100:
        return "{:.0f}{}".format(v, unit)
    if v >= 10:
        return "{:.1f}{}".format(v, unit)
    return "{:.2f}{}".format(v, unit)


def summary(r, args, svg_link):
    d = r["daemon"]
    out = []
    w = out.append
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    _, machine = machine_description()
    failed_goals = [g for g in r["goals"] if not g["ok"] and g["hard"]]
    w("Run of {}: **{}**.".format(date, "all goals met" if not failed_goals else
                                  "{} goal(s) failed".format(len(failed_goals))))
    w("")
    w("- Machine: {}; load average when the run started: {} (1, 5, 15 min)".format(machine, r["load_average"]))
    w("- Commit: {}".format(git_commit()))
    w("- Command: `{}`".format(args.command))
    w("- Daemon: model {}, placement {}, n_ctx {}, {} KV pages of {} tokens, max_running {}".format(
        d["model"], "prefill={} decode={}".format(d["placement"].get("prefill"), d["placement"].get("decode"))
        if isinstance(d.get("placement"), dict) else d.get("placement"), d["n_ctx"], d["kv_pages_total"],
        d["kv_page_size"], d["max_running"]))
    w("- Load: {} clients for {:.0f} s ({} references first, in {:.1f} s); warm-up {:.0f} s, latency windows "
      "{:.0f} s; {} requests ({:.1f}/s), {} failed".format(
          r["clients"], r["load_s"], r["references"], r["reference_s"], r["warmup_s"], r["window_s"],
          r["requests"], r["requests"] / max(r["load_s"], 1e-9), r["failed"]))
    lat = r["latency_ms"]
    w("- Latency over the run (answered generations, queueing included): TTFT P50 {} / P99 {} ms (streams), "
      "total P50 {} / P99 {} ms".format(fmt(lat["ttft_p50"]), fmt(lat["ttft_p99"]), fmt(lat["total_p50"]),
                                       fmt(lat["total_p99"])))
    w("")
    w("| goal | bound | measured | result |")
    w("|---|---|---|---|")
    for g in r["goals"]:
        res = "pass" if g["ok"] else ("**FAIL**" if g["hard"] else "warn (not a hard goal here)")
        w("| {} | {} | {} | {} |".format(g["name"], g["bound"], g["measured"].replace("|", "/"), res))
    w("")
    w("| kind | requests | streamed | cancelled | failed |")
    w("|---|---:|---:|---:|---:|")
    for name in sorted(r["kinds"], key=lambda k: -r["kinds"][k]["requests"]):
        k = r["kinds"][name]
        w("| {} | {} | {} | {} | {} |".format(name, k["requests"], k["streamed"], k["cancelled"], k["failed"]))
    w("")
    if r["failures"]:
        w("First failures (of {}):".format(r["failed"]))
        w("")
        for t, kind, variant, stream, why in r["failures"][:10]:
            w("- {} s, {} #{}{}: {}".format(t, kind, variant, " (stream)" if stream else "", why))
        w("")
    if svg_link:
        w("![RSS, fds and threads, KV pages and latency over the soak]({})".format(svg_link))
        w("")
    return "\n".join(out)


# ---------------------------------------------------------------- SVG

COLOURS = {"daemon": "#1f77b4", "prefill": "#d62728", "decode": "#2ca02c"}
OTHER = ["#9467bd", "#ff7f0e", "#8c564b", "#17becf"]


def nice_ticks(lo, hi, n=5):
    """Round ticks covering [lo, hi]: (ticks, lo, hi)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    lo = math.floor(lo / step) * step
    hi = math.ceil(hi / step) * step
    ticks = []
    v = lo
    while v <= hi + step / 2:
        ticks.append(round(v, 10))
        v += step
    return ticks, lo, hi


def panel(x0, y0, w, h, title, ylabel, t_max, series, shade):
    """One time panel, y from 0. series: [(label, colour, dashed, [(t, y)])]; shade: [(t0, t1, label)]."""
    els = []
    ys = [y for _, _, _, pts in series for _, y in pts if y is not None]
    yt, lo, hi = nice_ticks(0, max(ys) * 1.05 if ys else 1)
    t_hi = max(t_max, 1e-9)
    xt = [t for t in nice_ticks(0, t_hi, 6)[0] if t <= t_hi * 1.001]

    def px(t):
        return x0 + t / t_hi * w

    def py(y):
        return y0 + h - (y - lo) / (hi - lo) * h

    for t0, t1, label in shade:
        els.append('<rect x="{:.1f}" y="{}" width="{:.1f}" height="{}" class="shade"><title>{}</title></rect>'.format(
            px(t0), y0, max(px(t1) - px(t0), 0), h, html.escape(label)))
    els += axes(x0, y0, w, h, title, "minutes into the load", ylabel, [(py(t), "{:g}".format(t)) for t in yt],
                [(px(t), "{:g}".format(t)) for t in xt])
    for i, (label, colour, dashed, pts) in enumerate(series):
        pts = [(t, y) for t, y in pts if y is not None]
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        if pts:
            els.append('<polyline points="{}" fill="none" stroke="{}" stroke-width="1.6"{}/>'.format(
                " ".join("{:.1f},{:.1f}".format(px(t), py(y)) for t, y in pts), colour, dash))
        # the legend under the axis, two columns
        lx, ly = x0 + (i % 2) * w / 2, y0 + h + 54 + (i // 2) * 14
        els.append('<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="{}" stroke-width="2"{}/>'.format(
            lx, ly - 4, lx + 18, ly - 4, colour, dash))
        els.append('<text x="{:.1f}" y="{}" class="legend">{}</text>'.format(lx + 24, ly, html.escape(label)))
    return els


def svg(r):
    width, height = 1000, 780
    els = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" '
        'font-family="sans-serif" font-size="11">'.format(width, height),
        "<style>.title{font-size:13px;font-weight:bold;text-anchor:middle}.frame{fill:none;stroke:#444}"
        ".grid{stroke:#e4e4e4}.ytick{text-anchor:end;fill:#333}.xtick{text-anchor:middle;fill:#333}"
        ".axis{text-anchor:middle;fill:#333}.legend{fill:#222;font-size:10px}.small{font-size:11px;fill:#555}"
        ".shade{fill:#f2f2f2}</style>",
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    samples = r["samples"]
    t_max = r["load_s"] / 60
    shade = [(0, r["warmup_s"] / 60, "warm-up"),
             (max(0, (r["load_s"] - r["window_s"]) / 60), t_max, "last latency window")]
    names = sorted({n for s in samples for n in s["procs"]}, key=lambda n: (n != "daemon", n))
    colour = {n: COLOURS.get(n, OTHER[i % len(OTHER)]) for i, n in enumerate(names)}

    def proc_series(field, scale=1.0, dashed=False, suffix=""):
        return [(n + suffix, colour[n], dashed,
                 [(s["t"] / 60, s["procs"][n][field] * scale if s["procs"].get(n) else None) for s in samples])
                for n in names]

    mib = 1 / 1024
    els += panel(70, 40, 380, 220, "Memory per process", "MiB", t_max,
                 proc_series("private_kb", mib, False, " RSS - shared") + proc_series("rss_kb", mib, True, " RSS"),
                 shade)
    els += panel(580, 40, 380, 220, "Open fds (solid) and threads (dashed)", "count", t_max,
                 proc_series("fds", 1, False, " fds") + proc_series("threads", 1, True, " threads"), shade)
    kv = [("pages used", "#1f77b4", False, [(s["t"] / 60, s["kv_pages_used"]) for s in samples]),
          ("free pages holding a cached prefix", "#ff7f0e", True, [(s["t"] / 60, s["kv_pages_cached"]) for s in samples]),
          ("requests running", "#2ca02c", False, [(s["t"] / 60, s["running"]) for s in samples]),
          ("requests waiting", "#9467bd", True, [(s["t"] / 60, s["waiting"]) for s in samples])]
    els += panel(70, 410, 380, 220, "KV pages ({} in the pool) and the queue".format(r["daemon"]["kv_pages_total"]),
                 "pages / sequences", t_max, kv, shade)
    lat = [("total P99", "#d62728", False, [(s["t"] / 60, s["total_p99_ms"]) for s in samples]),
           ("total P50", "#d62728", True, [(s["t"] / 60, s["total_p50_ms"]) for s in samples]),
           ("TTFT P99 (streams)", "#1f77b4", False, [(s["t"] / 60, s["ttft_p99_ms"]) for s in samples]),
           ("TTFT P50 (streams)", "#1f77b4", True, [(s["t"] / 60, s["ttft_p50_ms"]) for s in samples])]
    els += panel(580, 410, 380, 220, "Latency of the requests answered in each {:g} s".format(r["sample_s"]),
                 "milliseconds", t_max, lat, shade)
    _, machine = machine_description()
    els.append('<text x="70" y="745" class="small">scripts/soak.sh: {} clients, {:.0f} minutes, {} requests, {} '
               'failed; grey: the warm-up and the last latency window.</text>'.format(
                   r["clients"], r["load_s"] / 60, r["requests"], r["failed"]))
    els.append('<text x="70" y="762" class="small">{}</text>'.format(html.escape(machine)))
    els.append("</svg>")
    return "\n".join(els) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--svg", required=True)
    ap.add_argument("--command", required=True, help="the command as a reader can repeat it")
    ap.add_argument("--docs-md", help="a page whose soak results block is replaced")
    ap.add_argument("--svg-link", default="soak.svg", help="the plot's path as the markdown links it")
    ap.add_argument("--daemon-exit", type=int, help="tandemd's exit code after SIGTERM at the end")
    ap.add_argument("--daemon-log", help="tandemd's stderr over the run")
    ap.add_argument("--quiet", action="store_true", help="do not print the goals judged here (a second run of the report)")
    args = ap.parse_args()
    with open(args.result) as f:
        r = json.load(f)
    if args.daemon_exit is not None:
        r["goals"].append({"name": "tandemd stops cleanly at the end (SIGTERM)", "ok": args.daemon_exit == 0,
                           "hard": True, "measured": "exit {}".format(args.daemon_exit), "bound": "exit 0"})
    if args.daemon_log:
        levels = {"warning": 0, "error": 0, "critical": 0}
        first = None
        with open(args.daemon_log, errors="replace") as f:
            for line in f:
                for lv in levels:
                    if " {}: ".format(lv) in line:  # "[time] logger level: text", or "logger: level: text"
                        levels[lv] += 1
                        if lv != "warning" and first is None:
                            first = line.strip()[:160]
        bad = levels["error"] + levels["critical"]
        r["goals"].append({"name": "no error in tandemd's log", "ok": bad == 0, "hard": True,
                           "measured": "{} errors, {} critical, {} warnings{}".format(
                               levels["error"], levels["critical"], levels["warning"],
                               "; first: " + first if first else ""), "bound": "0 errors"})
    for g in r["goals"][-2:] if not args.quiet else []:
        if g["name"].startswith(("tandemd stops", "no error in")):  # the goals soak.py could not judge
            print("soak: {} {}: {} (bound: {})".format("ok  " if g["ok"] else "FAIL", g["name"], g["measured"],
                                                      g["bound"]), file=sys.stderr)
    text = summary(r, args, args.svg_link)
    with open(args.md, "w") as f:
        f.write(text + "\n")
    with open(args.svg, "w") as f:
        f.write(svg(r))
    if args.docs_md:
        with open(args.docs_md) as f:
            page = f.read()
        if BEGIN not in page or END not in page:
            sys.exit("soak_report: {} has no soak results markers".format(args.docs_md))
        head, rest = page.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        with open(args.docs_md, "w") as f:
            f.write(head + BEGIN + "\n" + text + "\n" + END + tail)
    return 1 if any(g["hard"] and not g["ok"] for g in r["goals"]) else 0


if __name__ == "__main__":
    sys.exit(main())
