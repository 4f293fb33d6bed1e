#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Plot bench_hit's CSV: aggregate hit throughput against threads (own buffers, one shared buffer,
random own buffers, random shared buffers), one-thread latency by access pattern (mean, p50, p99),
and the traces' hit rates, every system. Usage: plot_hits.py [hits.csv] [out.png] (defaults:
bench/hits.csv, bench/hit_throughput.png)."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

src = sys.argv[1] if len(sys.argv) > 1 else "bench/hits.csv"
dst = sys.argv[2] if len(sys.argv) > 2 else "bench/hit_throughput.png"
rows = list(csv.DictReader(open(src)))
tp = [r for r in rows if r["metric"] == "hit_throughput"]
if not tp:
    sys.exit(f"{src}: no hit_throughput rows")
m = tp[0]
machine = f"{m['gpu']}, driver {m['driver']}, CUDA {m['cuda']}, {m['cpus']} CPUs"
systems = list(dict.fromkeys(r["system"] for r in tp))
style = {"gdr-events": ("tab:green", "o"), "gdr-tag": ("tab:blue", "s"),
         "tagcheck": ("tab:red", "^"), "ucs-rcache": ("tab:purple", "D"),
         "preload": ("tab:olive", "v")}
panels = (("own", "own buffer per thread"), ("shared", "one buffer shared by all"),
          ("own-rand", "random of its own 128 buffers"),
          ("shared-rand", "random of 2048 shared buffers"))
fig, axes = plt.subplots(2, 3, figsize=(17, 9))
flat = [axes[0][0], axes[0][1], axes[1][0], axes[1][1]]
for ax, (buffers, title) in zip(flat, panels):
    for s in systems:
        pts = sorted((int(r["threads"]), float(r["value"])) for r in tp
                     if r["system"] == s and r["buffers"] == buffers)
        if not pts:
            continue
        color, marker = style.get(s, (None, "x"))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=s)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([1, 2, 4, 8, 16])
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("threads")
    ax.set_ylabel("M hits (register + release) / s")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
flat[0].legend()

# One-thread latency by pattern: mean (bar), p50 and p99 (markers).
ax = axes[0][2]
lat = {(r["system"], r["buffers"], r["metric"]): float(r["value"]) for r in rows
       if r["metric"] in ("hit_latency", "hit_latency_p50", "hit_latency_p99")}
patterns = list(dict.fromkeys(r["buffers"] for r in rows if r["metric"] == "hit_latency"))
width = 0.8 / max(1, len(systems))
for i, s in enumerate(systems):
    xs = [j + i * width for j in range(len(patterns))]
    color = style.get(s, (None, "x"))[0]
    ax.bar(xs, [lat.get((s, p, "hit_latency"), 0) for p in patterns], width, color=color,
           alpha=0.6, label=s)
    ax.scatter(xs, [lat.get((s, p, "hit_latency_p99"), 0) for p in patterns], color=color,
               marker="v", s=14)
ax.set_xticks([j + 0.4 - width / 2 for j in range(len(patterns))])
ax.set_xticklabels(patterns, fontsize=8)
ax.set_yscale("log")
ax.set_ylabel("ns per hit, one thread (bar: mean; v: p99)")
ax.set_title("one-thread latency by access pattern")
ax.grid(True, which="both", axis="y", alpha=0.3)

# Hit rate by trace.
ax = axes[1][2]
hr = {(r["system"], r["trace"]): float(r["value"]) * 100 for r in rows
      if r["metric"] == "trace_hit_rate"}
traces = list(dict.fromkeys(r["trace"] for r in rows if r["metric"] == "trace_hit_rate"))
for i, s in enumerate(systems):
    xs = [j + i * width for j in range(len(traces))]
    ax.bar(xs, [hr.get((s, t), 0) for t in traces], width, color=style.get(s, (None, "x"))[0],
           label=s)
ax.set_xticks([j + 0.4 - width / 2 for j in range(len(traces))])
ax.set_xticklabels(traces, fontsize=8)
ax.set_ylabel("hit rate, %")
ax.set_title("traces: registrations that did not pin")
ax.grid(True, axis="y", alpha=0.3)
fig.suptitle(f"Registration-cache hits — {machine}", fontsize=10)
fig.tight_layout()
fig.savefig(dst, dpi=110)
print(f"wrote {dst}")
