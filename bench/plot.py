"""Plots for bench/run: `plot.py KIND CSV PNG`. Uses matplotlib."""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import mathis_model, slow_start_model, window_model  # noqa: E402


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
    note = os.environ.get("BENCH_PLOT_NOTE", "")
    ax.set_title("XFTP fig. 10 (scaled x10): 15.36 Mbit/s, 56 ms RTT, W = 24 KiB"
                 + (f"\n{note}" if note else ""), fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def psock2(rows, out):
    # Must match exp_psockets_fig2 in bench/run.
    rate, rtt, window = 100e6, 0.060, 65535
    fig, ax = plt.subplots(figsize=(7.5, 5))
    styles = {"xftp-pipe": ("o", "tab:blue", "-"), "xftp-get": ("D", "tab:orange", "-"),
              "globus-url-copy": ("^", "tab:purple", "-"), "iperf3": ("s", "tab:green", ":")}
    ns = sorted({int(r["streams"]) for r in rows})
    size = max(int(r["bytes"]) for r in rows)
    for tool, (m, c, ls) in styles.items():
        pts = sorted((int(r["streams"]), float(r["mbit_s"])) for r in rows if r["tool"] == tool)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=m, color=c, linestyle=ls, label=tool)
    curl = [float(r["mbit_s"]) for r in rows if r["tool"] == "curl"]
    if curl:
        ax.plot([1], curl[:1], marker="*", markersize=13, color="tab:red", linestyle="none",
                label="curl (one connection)")
    ax.plot(ns, [window_model(n, window, rtt, rate) / 1e6 for n in ns], color="black",
            linewidth=1, alpha=0.5, label="model N·W/RTT, capped")
    ax.plot(ns, [slow_start_model(size, n, window, rtt, rate) / 1e6 for n in ns], color="black",
            linestyle="--", linewidth=1, alpha=0.5, label=f"model with slow start, {size / 2**20:g} MiB")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("sockets N")
    ax.set_ylabel("throughput (Mbit/s)")
    ax.set_title("PSockets fig. 2: 100 Mbit/s, 60 ms RTT, W = 64 KiB")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def roundtrips(rows, out):
    tools = list(dict.fromkeys(r["tool"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, tool in enumerate(tools):
        v = [float(r["round_trips"]) for r in rows if r["tool"] == tool]
        ax.bar(i, sum(v) / len(v), color="tab:blue", alpha=0.6)
        ax.plot([i] * len(v), v, "k.", markersize=8)
    ax.axhline(5, color="tab:red", linestyle="--", linewidth=1, label="goal for xftp: 5 round trips")
    ax.set_xticks(range(len(tools)))
    ax.set_xticklabels(tools)
    ax.set_ylabel("round trips (wall clock / 560 ms)")
    ax.set_title("1 KiB download, 560 ms RTT (bars: mean, dots: runs)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def autoprof(rows, out):
    profs = list(dict.fromkeys(r["profile"] for r in rows))
    cols = min(3, len(profs))
    nrows = (len(profs) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.6 * nrows), squeeze=False)
    for k, prof in enumerate(profs):
        ax = axes[k // cols][k % cols]
        rs = [r for r in rows if r["profile"] == prof]
        r0 = rs[0]
        window, rate, rtt, loss = int(r0["window"]), float(r0["rate"]), float(r0["rtt"]), float(r0["loss"])
        size = int(r0["bytes"])
        fixed = sorted((int(r["streams"]), float(r["mbit_s"])) for r in rs if r["tool"] == "xftp-get")
        ns = [p[0] for p in fixed]
        ax.plot(ns, [p[1] for p in fixed], marker="o", color="tab:orange", label="xftp get -p N")
        for tool, m, c in (("xftp-get-auto-fresh", "*", "tab:red"), ("xftp-get-auto-warm", "P", "tab:blue")):
            a = [(int(r["streams"] or 0), float(r["mbit_s"])) for r in rs if r["tool"] == tool]
            if a:
                ax.plot([x[0] for x in a], [x[1] for x in a], marker=m, markersize=12, linestyle="none",
                        color=c, label=tool.replace("xftp-get-", "-p ") + " (at final N)")
        if window:
            ax.plot(ns, [window_model(n, window, rtt, rate) / 1e6 for n in ns], color="black",
                    linewidth=1, alpha=0.5, label="N·W/RTT, capped")
            ax.plot(ns, [slow_start_model(size, n, window, rtt, rate) / 1e6 for n in ns], color="black",
                    linestyle="--", linewidth=1, alpha=0.5, label="with slow start")
        elif loss:
            ax.plot(ns, [mathis_model(n, rtt, loss, rate) / 1e6 for n in ns], color="black",
                    linewidth=1, alpha=0.5, label="N x Mathis (Reno-like), capped")
        else:
            ax.axhline(rate / 1e6, color="black", linewidth=1, alpha=0.5, label="link rate")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.set_title(f"{prof} ({r0['cc']})", fontsize=10)
        ax.set_xlabel("connections N")
        ax.set_ylabel("Mbit/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for k in range(len(profs), nrows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def fig11(rows, out):
    # Must match exp_xftp_fig11 in bench/run.
    rate, rtt = 15.36e6, 0.056
    size = int(rows[0]["bytes"])
    fig, ax = plt.subplots(figsize=(7.5, 5))
    markers = ["o", "s", "D", "^", "v"]
    for i, w in enumerate(sorted({int(r["window"]) for r in rows})):
        pts = sorted((int(r["effective_window"]), float(r["mbit_s"]), r["streams"]) for r in rows
                     if int(r["window"]) == w)
        ax.plot([p[0] / 1024 for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)],
                linestyle="none", markersize=8, label=f"W = {w // 1024} KiB, N = " + ",".join(p[2] for p in pts))
    ew = sorted({int(r["effective_window"]) for r in rows})
    xs = [ew[0] * k / 20 for k in range(20, int(20 * ew[-1] / ew[0]) + 1)]
    ax.plot([x / 1024 for x in xs], [window_model(1, x, rtt, rate) / 1e6 for x in xs], color="black",
            linewidth=1, alpha=0.5, label="model min(N·W/RTT, rate)")
    ax.plot([x / 1024 for x in ew], [slow_start_model(size, 1, x, rtt, rate) / 1e6 for x in ew], color="black",
            linestyle="--", linewidth=1, alpha=0.5, label="with slow start (one window N·W), 5 MB")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("effective window N·W (KiB)")
    ax.set_ylabel("throughput (Mbit/s)")
    ax.set_title("XFTP fig. 11 (scaled x10): 15.36 Mbit/s, 56 ms RTT, queue 100p, 5 MB", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def fig6(rows, out):
    # Must match exp_psockets_fig6 in bench/run: 40 Mbit/s bottleneck.
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    x = 0
    ticks, labels = [], []
    for i, case in enumerate(cases):
        rs = [r for r in rows if r["case"] == case]
        start = x
        for r in rs:
            ax.bar(x, float(r["mbit_s"]), color=f"C{i}", alpha=0.75)
            ax.text(x, float(r["mbit_s"]) + 0.5, f"{r['streams']} conn", ha="center", fontsize=7)
            x += 1
        ticks.append((start + x - 1) / 2)
        labels.append(case)
        x += 1
    ax.axhline(40, color="black", linewidth=1, alpha=0.5, label="bottleneck 40 Mbit/s")
    ax.axhline(8.74, color="black", linestyle="--", linewidth=1, alpha=0.5, label="one connection's window limit W/RTT")
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels)
    ax.set_ylabel("throughput per application (Mbit/s)")
    ax.set_title("PSockets fig. 6 (reduced): applications sharing 40 Mbit/s, 60 ms, W = 64 KiB", fontsize=10)
    ax.set_ylim(0, 45)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def mftp6(rows, out):
    # Must match exp_mftp_fig6 in bench/run.
    rate, window = 45e6, 24576
    size = int(rows[0]["bytes"])
    fig, ax = plt.subplots(figsize=(7.5, 5))
    rtts = sorted({int(r["rtt_ms"]) for r in rows})
    fine = [rtts[0] + (rtts[-1] - rtts[0]) * k / 100 for k in range(101)]
    for i, n in enumerate(sorted({int(r["streams"]) for r in rows})):
        pts = sorted((int(r["rtt_ms"]), float(r["mbit_s"])) for r in rows if int(r["streams"]) == n)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{i}", label=f"xftp get -p {n}")
        ax.plot(fine, [window_model(n, window, t / 1000, rate) / 1e6 for t in fine], color=f"C{i}",
                linewidth=1, alpha=0.5)
        ax.plot(rtts, [slow_start_model(size, n, window, t / 1000, rate) / 1e6 for t in rtts], color=f"C{i}",
                linestyle="--", linewidth=1, alpha=0.5)
    ax.plot([], [], color="gray", label="model N·W/RTT, capped")
    ax.plot([], [], color="gray", linestyle="--", label=f"with slow start, {size / 1e6:g} MB")
    ax.set_yscale("log")
    ax.set_xlabel("RTT (ms)")
    ax.set_ylabel("throughput (Mbit/s, log)")
    ax.set_title("MFTP fig. 6 (reduced): 45 Mbit/s, W = 24 KiB", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


KINDS = {"fig10": fig10, "fig11": fig11, "fig6": fig6, "mftp6": mftp6, "psock2": psock2, "roundtrips": roundtrips, "autoprof": autoprof}

if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in KINDS:
        sys.exit(f"usage: plot.py {{{','.join(KINDS)}}} CSV PNG")
    KINDS[sys.argv[1]](read(sys.argv[2]), sys.argv[3])
