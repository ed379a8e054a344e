"""Plots for bench/run: `plot.py KIND CSV PNG`. Uses matplotlib."""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import slow_start_model, window_model  # noqa: E402


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fig10(rows, out):
    # Must match exp_xftp_fig10 in bench/run.
    rate, rtt, window = 15.36e6, 0.056, 24576
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = sorted({int(r["size_bytes"]) for r in rows})
    ns = sorted({int(r["streams"]) for r in rows if r["tool"] == "iperf3"})
    markers = {"xftp-pipe": "o", "xftp-get": "D", "iperf3": "s"}
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for i, size in enumerate(sizes):
        c = colors[i % len(colors)]
        for tool, m in markers.items():
            pts = [(int(r["streams"]), float(r["mbit_s"])) for r in rows
                   if r["tool"] == tool and int(r["size_bytes"]) == size]
            if pts:
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=m, color=c,
                        linestyle=":" if tool == "iperf3" else "-",
                        label=f"{tool}, {size / 1e6:g} MB")
        auto = [(int(r["streams"]), float(r["mbit_s"])) for r in rows
                if r["tool"] == "xftp-get-auto" and int(r["size_bytes"]) == size and r["streams"]]
        if auto:
            ax.plot([a[0] for a in auto], [a[1] for a in auto], marker="*", markersize=12,
                    linestyle="none", color=c, label=f"xftp get -p auto, {size / 1e6:g} MB")
        ax.plot(ns, [slow_start_model(size, n, window, rtt, rate) / 1e6 for n in ns],
                color=c, linestyle="--", linewidth=1, alpha=0.7,
                label=f"model with slow start, {size / 1e6:g} MB")
    ax.plot(ns, [window_model(n, window, rtt, rate) / 1e6 for n in ns], color="black",
            linestyle="-", linewidth=1, alpha=0.5, label="model N·W/RTT, capped")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("connections N")
    ax.set_ylabel("throughput (Mbit/s)")
    ax.set_title("XFTP fig. 10 (scaled x10): 15.36 Mbit/s, 56 ms RTT, W = 24 KiB")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


KINDS = {"fig10": fig10}

if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in KINDS:
        sys.exit(f"usage: plot.py {{{','.join(KINDS)}}} CSV PNG")
    KINDS[sys.argv[1]](read(sys.argv[2]), sys.argv[3])
