#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Plot bench_hit's CSV: aggregate hit throughput against threads, own buffers and one shared
buffer, every system. Usage: plot_hits.py [hits.csv] [out.png] (defaults: bench/hits.csv,
bench/hit_throughput.png)."""
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
         "tagcheck": ("tab:red", "^"), "ucs-rcache": ("tab:purple", "D")}
fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
for ax, buffers, title in ((axes[0], "own", "own buffer per thread"),
                           (axes[1], "shared", "one buffer shared by all threads")):
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
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
axes[0].set_ylabel("aggregate hits (register + release) per second, millions")
axes[0].legend()
fig.suptitle(f"Registration-cache hit throughput — {machine}", fontsize=10)
fig.tight_layout()
fig.savefig(dst, dpi=120)
print(f"wrote {dst}")
