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
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    sizes = sorted({int(r["size_bytes"]) for r in rows})
    ns = sorted({int(r["streams"]) for r in rows if r["tool"] == "iperf3"})
    markers = {"xftp-pipe": "o", "xftp-get": "D", "iperf3": "s", "globus-url-copy": "^"}
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
        curl = [float(r["mbit_s"]) for r in rows if r["tool"] == "curl" and int(r["size_bytes"]) == size]
        if curl:
            ax.plot([1], curl[:1], marker="X", markersize=10, linestyle="none", color=c,
                    label=f"curl (one connection), {size / 1e6:g} MB")
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
    # Outside the axes: inside, it covers the points at N = 12-16.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def psock2(rows, out):
    # Must match exp_psockets_fig2 in bench/run.
    rate, rtt, window = 100e6, 0.060, 65535
    fig, ax = plt.subplots(figsize=(7.5, 5))
    styles = {"xftp-pipe": ("o", "tab:blue", "-"), "xftp-get": ("D", "tab:orange", "-"),
              "globus-url-copy": ("^", "tab:purple", "-"), "iperf3": ("s", "tab:green", ":")}
    ns = sorted({int(r["streams"]) for r in rows if r["tool"] != "xftp-get-auto"})
    size = max(int(r["bytes"]) for r in rows)
    for tool, (m, c, ls) in styles.items():
        pts = sorted((int(r["streams"]), float(r["mbit_s"])) for r in rows if r["tool"] == tool)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=m, color=c, linestyle=ls, label=tool)
    curl = [float(r["mbit_s"]) for r in rows if r["tool"] == "curl"]
    if curl:
        ax.plot([1], curl[:1], marker="X", markersize=11, color="tab:red", linestyle="none",
                label="curl (one connection)")
    for r in rows:
        if r["tool"] == "xftp-get-auto":
            y = float(r["mbit_s"])
            ax.axhline(y, color="black", linestyle=(0, (1, 3)), linewidth=1.2)
            if r["streams"]:
                ax.plot([int(r["streams"])], [y], marker="*", markersize=14, color="black", markerfacecolor="gold",
                        linestyle="none")
            ax.plot([], [], marker="*", markersize=12, color="black", markerfacecolor="gold", linestyle=(0, (1, 3)),
                    label=f"xftp get -p auto (ended with {r['streams'] or '?'} connections)")
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


# Marker, line style and label of each tool in the comparison plots.
TOOL_STYLE = {
    "xftp-get": ("o", "-", "xftp get -p N"),
    "iperf3": ("s", ":", "iperf3 -P N (memory to memory)"),
    "globus-url-copy": ("^", "-.", "globus-url-copy -p N"),
    "curl": ("X", "none", "curl (one connection)"),
    "xftp-get-auto": ("*", "none", "xftp -p auto (at the N it ended with)"),
}


def _tool_legend(ax, tools, extra=(), **kw):
    """Legend entries for the tools (gray markers) plus EXTRA handles."""
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color="gray", marker=TOOL_STYLE[t][0], linestyle=TOOL_STYLE[t][1]
                      if TOOL_STYLE[t][1] != "none" else "none", markersize=8 if t != "xftp-get-auto" else 12,
                      label=TOOL_STYLE[t][2]) for t in tools]
    ax.legend(handles=list(extra) + handles, **kw)


def fig11(rows, out):
    # Must match exp_xftp_fig11 in bench/run.
    rate, rtt = 15.36e6, 0.056
    size = int(rows[0]["bytes"])
    fig, ax = plt.subplots(figsize=(8, 5.5))
    from matplotlib.patches import Patch
    windows = sorted({int(r["window"]) for r in rows})
    tools = [t for t in TOOL_STYLE if any(r["tool"] == t for r in rows)]
    for i, w in enumerate(windows):
        c = f"C{i}"
        for tool in tools:
            m, ls, _ = TOOL_STYLE[tool]
            pts = sorted((int(r["effective_window"]), float(r["mbit_s"])) for r in rows
                         if int(r["window"]) == w and r["tool"] == tool and r["streams"])
            if not pts:
                continue
            ax.plot([p[0] / 1024 for p in pts], [p[1] for p in pts], marker=m,
                    linestyle=ls, color=c, alpha=0.8,
                    markersize=13 if tool == "xftp-get-auto" else 7,
                    markerfacecolor="none" if tool in ("iperf3", "globus-url-copy") else c)
    ew = sorted({int(r["effective_window"]) for r in rows if r["effective_window"] not in ("", "0")})
    xs = [ew[0] * k / 20 for k in range(20, int(20 * ew[-1] / ew[0]) + 1)]
    model, = ax.plot([x / 1024 for x in xs], [window_model(1, x, rtt, rate) / 1e6 for x in xs], color="black",
                     linewidth=1, alpha=0.5, label="model min(N·W/RTT, rate)")
    slow, = ax.plot([x / 1024 for x in ew], [slow_start_model(size, 1, x, rtt, rate) / 1e6 for x in ew],
                    color="black", linestyle="--", linewidth=1, alpha=0.5,
                    label=f"with slow start (one window N·W), {size / 1e6:g} MB")
    wins = [Patch(color=f"C{i}", label=f"W = {w // 1024} KiB") for i, w in enumerate(windows)]
    ax.set_xscale("log", base=2)
    ax.set_xlabel("effective window N·W (KiB)")
    ax.set_ylabel("throughput (Mbit/s)")
    ax.set_title(f"XFTP fig. 11 (scaled x10): 15.36 Mbit/s, 56 ms RTT, queue 100p, {size / 1e6:g} MB", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _tool_legend(ax, tools, wins + [model, slow], fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def fig6(rows, out):
    # Must match exp_psockets_fig6 in bench/run: 40 Mbit/s bottleneck. Left: k
    # applications of 8 connections (xftp send/recv and iperf3 side by side);
    # right: one 8-connection (or -p auto) application beside one connection.
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [3, 2]})
    colors = {"xftp-pipe": "C0", "iperf3": "C2", "globus-url-copy": "C4", "xftp-get": "C1",
              "xftp-get-auto": "gold", "curl": "C3"}
    tools_seen = []
    kapps = [r for r in rows if " apps x 8" in r["case"]]
    ks = sorted({int(r["case"].split()[0]) for r in kapps})
    x = 0
    ticks = []
    for k in ks:
        start = x
        for tool in ("xftp-pipe", "iperf3"):
            rs = [r for r in kapps if int(r["case"].split()[0]) == k and r["tool"] == tool]
            for r in rs:
                ax.bar(x, float(r["mbit_s"]), color=colors[tool], alpha=0.8)
                x += 1
            if rs:
                tools_seen.append(tool)
                x += 0.3
        ax.plot([start - 0.4, x - 0.9], [40 / k] * 2, color="black", linewidth=1.5)
        ticks.append((start + x - 1.3) / 2)
        x += 1
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{k} x 8" for k in ks], fontsize=8)
    ax.axhline(8.74, color="black", linestyle="--", linewidth=1, alpha=0.5)
    ax.set_xlabel("applications x connections")
    ax.set_ylabel("throughput per application (Mbit/s)")
    ax.set_title("k applications of 8 connections each (bars: one per application)", fontsize=10)
    ax.set_ylim(0, 45)
    ax.grid(alpha=0.3, axis="y")
    x = 0
    ticks, labels = [], []
    pairs = [c for c in dict.fromkeys(r["case"] for r in rows) if " apps x 8" not in c]
    for case in pairs:
        rs = [r for r in rows if r["case"] == case]
        start = x
        for r in rs:
            y = float(r["mbit_s"])
            bx.bar(x, y, color=colors.get(r["tool"], "gray"), alpha=0.8, edgecolor="black", linewidth=0.5)
            bx.text(x, y + 0.5, f"{r['streams'] or '?'} conn\n{r['share_pct']} %", ha="center", fontsize=6)
            tools_seen.append(r["tool"])
            x += 1
        ticks.append((start + x - 1) / 2)
        labels.append(case.replace(" beside 1", "\nbeside 1").replace(" (", "\n("))
        x += 0.8
    bx.set_xticks(ticks)
    bx.set_xticklabels(labels, fontsize=7)
    bx.axhline(8.74, color="black", linestyle="--", linewidth=1, alpha=0.5)
    bx.set_title("one application beside one single-connection transfer\n(text: connections, share of the pair)",
                 fontsize=10)
    # Headroom above the bars for the legend.
    bx.set_ylim(0, 62)
    bx.grid(alpha=0.3, axis="y")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    names = {"xftp-pipe": "xftp send/recv", "iperf3": "iperf3 (memory to memory)", "globus-url-copy":
             "globus-url-copy -p 8", "xftp-get": "xftp get -p 8", "xftp-get-auto": "xftp get -p auto",
             "curl": "curl (one connection)"}
    handles = [Patch(color=colors[t], alpha=0.8, label=names[t]) for t in dict.fromkeys(tools_seen)]
    handles += [Line2D([], [], color="black", linewidth=1.5, label="fair share 40/k (left)"),
                Line2D([], [], color="black", linestyle="--", alpha=0.5, label="one connection's window limit W/RTT")]
    bx.legend(handles=handles, fontsize=7, loc="upper center", ncol=2)
    fig.suptitle("PSockets fig. 6: applications sharing 40 Mbit/s, 60 ms, W = 64 KiB", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def mftp6(rows, out):
    # Must match exp_mftp_fig6 in bench/run.
    rate, window = 45e6, 24576
    size = int(rows[0]["bytes"])
    fig, ax = plt.subplots(figsize=(7.5, 5))
    rtts = sorted({int(r["rtt_ms"]) for r in rows})
    fine = [rtts[0] + (rtts[-1] - rtts[0]) * k / 100 for k in range(101)]
    fixed = [r for r in rows if r["tool"] == "xftp-get"]
    for i, n in enumerate(sorted({int(r["streams"]) for r in fixed})):
        pts = sorted((int(r["rtt_ms"]), float(r["mbit_s"])) for r in fixed if int(r["streams"]) == n)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{i}", label=f"xftp get -p {n}")
        # RTT 0 is the namespaces' own, about 0.1 ms.
        ax.plot(fine, [window_model(n, window, max(t, 0.1) / 1000, rate) / 1e6 for t in fine], color=f"C{i}",
                linewidth=1, alpha=0.5)
        ax.plot(rtts, [slow_start_model(size, n, window, max(t, 0.1) / 1000, rate) / 1e6 for t in rtts],
                color=f"C{i}", linestyle="--", linewidth=1, alpha=0.5)
    auto = sorted((int(r["rtt_ms"]), float(r["mbit_s"]), r["streams"]) for r in rows if r["tool"] == "xftp-get-auto")
    if auto:
        ax.plot([a[0] for a in auto], [a[1] for a in auto], marker="*", markersize=13, color="black",
                markerfacecolor="gold", linestyle="-", linewidth=1.5,
                label="xftp get -p auto (number: connections it ended with)")
        for x, y, f in auto:
            ax.annotate(f or "?", (x, y), textcoords="offset points", xytext=(6, 4), fontsize=7)
    curl = sorted((int(r["rtt_ms"]), float(r["mbit_s"])) for r in rows if r["tool"] == "curl")
    if curl:
        ax.plot([c[0] for c in curl], [c[1] for c in curl], marker="X", markersize=8, color="gray",
                linestyle=":", label="curl (one connection)")
    ax.plot([], [], color="gray", label="model N·W/RTT, capped")
    ax.plot([], [], color="gray", linestyle="--", label=f"with slow start, {size / 1e6:g} MB")
    ax.set_yscale("log")
    ax.set_xlabel("RTT (ms)")
    ax.set_ylabel("throughput (Mbit/s, log)")
    ax.set_title("MFTP fig. 6: 45 Mbit/s, W = 24 KiB", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def mftp6tools(rows, out):
    # Must match exp_mftp_fig6 in bench/run: one panel per RTT, every tool against N.
    rate, window = 45e6, 24576
    size = int(rows[0]["bytes"])
    rtts = sorted({int(r["rtt_ms"]) for r in rows})
    cols = min(3, len(rtts))
    nrows = (len(rtts) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.5 * nrows), squeeze=False)
    colors = {"xftp-get": "tab:orange", "iperf3": "tab:green", "globus-url-copy": "tab:purple",
              "curl": "tab:red", "xftp-get-auto": "black"}
    tools = [t for t in TOOL_STYLE if any(r["tool"] == t for r in rows)]
    for k, rtt in enumerate(rtts):
        ax = axes[k // cols][k % cols]
        rs = [r for r in rows if int(r["rtt_ms"]) == rtt and r["streams"]]
        ns = sorted({int(r["streams"]) for r in rs if r["tool"] == "xftp-get"})
        for tool in tools:
            m, ls, _ = TOOL_STYLE[tool]
            pts = sorted((int(r["streams"]), float(r["mbit_s"])) for r in rs if r["tool"] == tool)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=m, linestyle=ls, color=colors[tool],
                        markersize=12 if tool == "xftp-get-auto" else 6,
                        markerfacecolor="gold" if tool == "xftp-get-auto" else colors[tool])
        if ns:
            t = max(rtt, 0.1) / 1000
            ax.plot(ns, [window_model(n, window, t, rate) / 1e6 for n in ns], color="black", linewidth=1,
                    alpha=0.4)
            ax.plot(ns, [slow_start_model(size, n, window, t, rate) / 1e6 for n in ns], color="black",
                    linestyle="--", linewidth=1, alpha=0.4)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ns)
            ax.set_xticklabels([str(n) for n in ns])
        ax.set_title(f"RTT {rtt} ms" if rtt else "RTT 0 (namespaces' own)", fontsize=10)
        ax.set_xlabel("connections N")
        ax.set_ylabel("Mbit/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for k in range(len(rtts), nrows * cols):
        axes[k // cols][k % cols].axis("off")
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=colors[t], marker=TOOL_STYLE[t][0], linestyle=TOOL_STYLE[t][1],
                      markerfacecolor="gold" if t == "xftp-get-auto" else colors[t],
                      markersize=11 if t == "xftp-get-auto" else 6, label=TOOL_STYLE[t][2]) for t in tools]
    handles += [Line2D([], [], color="black", alpha=0.4, label="model N·W/RTT, capped"),
                Line2D([], [], color="black", alpha=0.4, linestyle="--", label=f"with slow start, {size / 1e6:g} MB")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle("MFTP fig. 6 link (45 Mbit/s, W = 24 KiB): tools against N at each RTT", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 0.97))
    fig.savefig(out, dpi=100)


def _ber_loss(ber, size=1500):
    """Per-packet loss of a bit error rate: 1 - (1 - BER)^(8 x size)."""
    return 1.0 - (1.0 - ber) ** (8 * size)


def _ber_model(n, window, ber, rtt=0.056, rate=15.36e6):
    per = window_model(1, window, rtt, rate)
    if ber > 0:
        per = min(per, mathis_model(1, rtt, _ber_loss(ber), rate))
    return min(n * per, rate)


def _median(xs):
    xs = sorted(xs)
    k = len(xs)
    return (xs[(k - 1) // 2] + xs[k // 2]) / 2


def fig12(rows, out):
    # Must match exp_xftp_fig12 in bench/run (part fig12: N x W = 192 KiB).
    rows = [r for r in rows if r["part"] == "fig12"]
    fig, ax = plt.subplots(figsize=(11, 5))
    bers = sorted({r["ber"] for r in rows}, key=float)
    ns = sorted({int(r["streams"]) for r in rows})
    for i, ber in enumerate(bers):
        c = f"C{i}"
        label = "error-free" if float(ber) == 0 else f"BER {ber} ({_ber_loss(float(ber)) * 100:.1f} % packets)"
        xs, meds = [], []
        for n in ns:
            vals = [float(r["mbit_s"]) for r in rows
                    if r["ber"] == ber and int(r["streams"]) == n and r["tool"] == "xftp-get"]
            if vals:
                ax.plot([n] * len(vals), vals, marker="o", color=c, linestyle="none", alpha=0.35, markersize=4)
                xs.append(n)
                meds.append(_median(vals))
        ax.plot(xs, meds, marker="o", color=c, label=f"xftp get, {label}")
        ip = sorted((int(r["streams"]), float(r["mbit_s"])) for r in rows
                    if r["ber"] == ber and r["tool"] == "iperf3")
        if ip:
            ax.plot([p[0] for p in ip], [p[1] for p in ip], marker="s", color=c, linestyle=":", alpha=0.8,
                    label=f"iperf3 -P N, {label}")
        gu = sorted((int(r["streams"]), float(r["mbit_s"])) for r in rows
                    if r["ber"] == ber and r["tool"] == "globus-url-copy")
        if gu:
            ax.plot([p[0] for p in gu], [p[1] for p in gu], marker="^", color=c, linestyle="-.", alpha=0.8,
                    label=f"globus-url-copy -p N, {label}")
        cu = [float(r["mbit_s"]) for r in rows if r["ber"] == ber and r["tool"] == "curl"]
        if cu:
            ax.plot([1], cu[:1], marker="X", markersize=9, color=c, linestyle="none", label=f"curl, {label}")
        au = sorted((int(r["streams"]), float(r["mbit_s"]), r.get("final_streams", "")) for r in rows
                    if r["ber"] == ber and r["tool"] == "xftp-get-auto")
        if au:
            ax.plot([a[0] for a in au], [a[1] for a in au], marker="*", markersize=13, color=c, linestyle="none",
                    markeredgecolor="black", markeredgewidth=0.5,
                    label=f"xftp -p auto on the link of W = 192 KiB / N, {label}")
            for x, y, f in au:
                ax.annotate(f or "?", (x, y), textcoords="offset points", xytext=(6, 4), fontsize=7, color=c)
        ax.plot(ns, [_ber_model(n, 196608 / n, float(ber)) / 1e6 for n in ns], color=c,
                linestyle="--", linewidth=1, alpha=0.5)
    ax.plot([], [], color="gray", linestyle="--", label="model N·min(W/RTT, Mathis)")
    if any(r["tool"] == "xftp-get-auto" for r in rows):
        ax.plot([], [], linestyle="none", label="(number by a star: connections -p auto ended with)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns)
    ax.set_xticklabels([f"{n}\n{196608 // n // 1024} KiB" for n in ns])
    ax.set_xlabel("connections N and window W (N·W = 192 KiB)")
    ax.set_ylabel("throughput (Mbit/s)")
    ax.set_title("XFTP fig. 12 (scaled x10): 15.36 Mbit/s, 56 ms RTT, constant N·W", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def table2(rows, out):
    # Must match exp_xftp_fig12 in bench/run (part table2).
    rows = [r for r in rows if r["part"] == "table2"]
    fig, ax = plt.subplots(figsize=(11, 5))
    ber = float(rows[0]["ber"])
    totals = sorted({int(r["effective_window"]) for r in rows})
    for kind, c, pick in (("N x 32 KiB", "C0", lambda r: int(r["streams"]) > 1),
                          ("one window", "C3", lambda r: int(r["streams"]) == 1)):
        for tool, m, ls in (("xftp-get", "o", "-"), ("iperf3", "s", ":"), ("globus-url-copy", "^", "-."),
                            ("curl", "X", "--")):
            xs, ys = [], []
            for t in totals:
                vals = [float(r["mbit_s"]) for r in rows
                        if int(r["effective_window"]) == t and r["tool"] == tool and pick(r)]
                if vals:
                    if tool == "xftp-get":
                        ax.plot([t / 1024] * len(vals), vals, marker=m, color=c, linestyle="none",
                                alpha=0.35, markersize=4)
                    xs.append(t / 1024)
                    ys.append(_median(vals))
            if xs:
                ax.plot(xs, ys, marker=m, color=c, linestyle=ls, label=f"{tool}, {kind}")
    for r in rows:
        if r["tool"] != "xftp-get-auto":
            continue
        fin = r.get("final_streams", "") or "?"
        if int(r["streams"]) > 1:
            ax.axhline(float(r["mbit_s"]), color="C0", linestyle=(0, (1, 3)), linewidth=1.5,
                       label=f"xftp -p auto on the 32 KiB link (ended with {fin})")
        else:
            t = int(r["effective_window"])
            ax.plot([t / 1024], [float(r["mbit_s"])], marker="*", markersize=13, color="C3", linestyle="none",
                    markeredgecolor="black", markeredgewidth=0.5)
            ax.annotate(fin, (t / 1024, float(r["mbit_s"])), textcoords="offset points", xytext=(6, 4),
                        fontsize=7, color="C3")
    if any(r["tool"] == "xftp-get-auto" and int(r["streams"]) == 1 for r in rows):
        ax.plot([], [], marker="*", markersize=11, color="C3", linestyle="none",
                label="xftp -p auto on the one-window link (number: connections it ended with)")
    ax.plot([t / 1024 for t in totals], [_ber_model(t // 32768, 32768, ber) / 1e6 for t in totals],
            color="C0", linestyle="--", linewidth=1, alpha=0.5, label="model, N x 32 KiB")
    ax.plot([t / 1024 for t in totals], [_ber_model(1, t, ber) / 1e6 for t in totals],
            color="C3", linestyle="--", linewidth=1, alpha=0.5, label="model, one window")
    ax.set_xlabel("total window (KiB)")
    ax.set_ylabel("throughput (Mbit/s)")
    ax.set_title(f"MFTP table 2 on the fig. 12 link: BER {rows[0]['ber']} "
                 f"({_ber_loss(ber) * 100:.1f} % packets), 15.36 Mbit/s, 56 ms", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def autogrid(rows, out):
    # Must match exp_auto_grid in bench/run: per path, auto fresh and warm
    # against the best fixed N, and the best's share of the payload limit.
    paths = list(dict.fromkeys(r["path"] for r in rows))
    fresh, warm, share, names = [], [], [], []
    for p in paths:
        rs = [r for r in rows if r["path"] == p]
        fixed = [r for r in rs if r["tool"] not in ("auto-fresh", "auto-warm") and r["mbit_s"] != "timeout"]
        if not fixed:
            continue
        best = max(fixed, key=lambda r: float(r["mbit_s"]))
        b = float(best["mbit_s"])

        def ratio(kind):
            x = next((r for r in rs if r["tool"] == kind), None)
            return float(x["mbit_s"]) / b if x and x["mbit_s"] != "timeout" else 0.0

        fresh.append(ratio("auto-fresh"))
        warm.append(ratio("auto-warm"))
        share.append(b / float(best["payload_limit_mbit_s"]))
        names.append(f"{p}\nN={best['streams']}")
    fig, ax = plt.subplots(figsize=(max(8, 0.5 * len(names) + 2), 4.5))
    x = range(len(names))
    w = 0.27
    ax.bar([i - w for i in x], fresh, w, label="auto fresh / best fixed")
    ax.bar(list(x), warm, w, label="auto warm / best fixed")
    ax.bar([i + w for i in x], share, w, label="best fixed / payload limit", color="tab:gray")
    ax.axhline(0.9, color="tab:red", lw=0.8, ls="--")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, fontsize=7)
    ax.set_ylim(0, 1.3)
    ax.set_ylabel("ratio")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


KINDS = {"fig10": fig10, "fig11": fig11, "fig6": fig6, "mftp6": mftp6, "mftp6tools": mftp6tools, "psock2": psock2, "roundtrips": roundtrips, "autoprof": autoprof, "fig12": fig12, "table2": table2, "autogrid": autogrid}

if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in KINDS:
        sys.exit(f"usage: plot.py {{{','.join(KINDS)}}} CSV PNG")
    KINDS[sys.argv[1]](read(sys.argv[2]), sys.argv[3])
