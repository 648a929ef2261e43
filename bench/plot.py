#!/usr/bin/env python3
"""Plots of a benchmark matrix run: `plot.py RESULTS_DIR` reads summary.json there and
writes throughput.png, latency.png, write_amp.png and commit_modes.png next to it.
Missing points (failed runs) leave gaps; a plot with no data at all says so instead."""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "chorus-embedded": dict(color="#d62728", marker="o"),
    "chorus-grpc-stream": dict(color="#e377c2", marker="X"),
    "chorus-grpc": dict(color="#ff7f0e", marker="s"),
    "etcd-raft": dict(color="#1f77b4", marker="^"),
    "openraft": dict(color="#2ca02c", marker="v"),
    "raft-rs": dict(color="#17becf", marker="*"),
    "chorus-embedded-piggyback": dict(color="#d62728", marker="o"),
    "chorus-embedded-sync": dict(color="#9467bd", marker="D"),
    "chorus-embedded-async": dict(color="#8c564b", marker="P"),
    "ceiling": dict(color="gray"),
}
LINES = ["chorus-embedded", "chorus-grpc-stream", "chorus-grpc", "etcd-raft", "openraft", "raft-rs"]


def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def series(points, lbl, field, size=512, positive=False):
    """(clients, value) of one system along the client sweep, without missing values (and
    without values a log axis cannot show, if `positive`)."""
    xs = sorted((p["clients"], p[field]) for p in points
                if p.get("label") == lbl and p.get("size") == size and num(p.get(field))
                and num(p.get("clients")) and (not positive or p[field] > 0))
    return [x for x, _ in xs], [y for _, y in xs]


def no_data(ax):
    ax.text(0.5, 0.5, "no data (failed or not run)", ha="center", va="center",
            transform=ax.transAxes, color="gray")


def main(out):
    path = os.path.join(out, "summary.json")
    try:
        with open(path) as f:
            s = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"plot.py: cannot read {path}: {e}")
    pts = [p for p in s.get("points") or [] if isinstance(p, dict) and "label" in p]
    # The commit-mode comparison has its own runs (section "modes"); summaries written
    # before that reused the main matrix's piggyback runs.
    piggy = "chorus-embedded-piggyback" if any(
        p["label"] == "chorus-embedded-piggyback" for p in pts) else "chorus-embedded"
    main_pts = [p for p in pts if p.get("section", "main") == "main"]
    when = str((s.get("machine") or {}).get("date") or "")[:16]
    foot = f"3 replicas as processes on one 2-core machine, loopback, fsync on · {when} UTC"

    # Throughput vs clients.
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    drawn = 0
    for lbl in LINES:
        x, y = series(main_pts, lbl, "appends_per_sec", positive=True)
        if x:
            ax.plot(x, y, label=lbl, **STYLE[lbl])
            drawn += 1
    ceil = next((p for p in main_pts if p["label"] == "ceiling" and p.get("size") == 512
                 and num(p.get("appends_per_sec")) and p["appends_per_sec"] > 0), None)
    if ceil:
        ax.axhline(ceil["appends_per_sec"] / 3, color="gray", ls="--",
                   label="disk ceiling ÷ 3 replicas (512 B)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("closed-loop clients")
    ax.set_ylabel("appends/s (512-byte records)")
    ax.set_title("Throughput vs clients")
    ax.grid(True, which="both", alpha=0.3)
    if drawn or ceil:
        ax.legend(fontsize=8)
    if not drawn:
        no_data(ax)
    fig.text(0.01, 0.01, foot, fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(os.path.join(out, "throughput.png"), dpi=110)
    plt.close(fig)

    # Latency vs clients.
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for ax, field, name in ((axes[0], "p50_us", "p50"), (axes[1], "p99_us", "p99")):
        drawn = 0
        for lbl in LINES:
            x, y = series(main_pts, lbl, field, positive=True)
            if x:
                ax.plot(x, [v / 1000 for v in y], label=lbl, **STYLE[lbl])
                drawn += 1
        if not drawn:
            no_data(ax)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("closed-loop clients")
        ax.set_title(f"commit latency {name} (512 B)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ms")
    fl = s.get("floor") or {}
    if num(fl.get("floor_us")) and fl["floor_us"] > 0:
        axes[0].axhline(fl["floor_us"] / 1000, color="gray", ls="--", label="fdatasync + 2 RTT")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    fig.text(0.01, 0.01, foot, fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(os.path.join(out, "latency.png"), dpi=110)
    plt.close(fig)

    # Write amplification vs record size (at the size sweep's client count).
    sizes = sorted({p["size"] for p in main_pts if num(p.get("size"))})
    size_clients = (s.get("args") or {}).get("size_clients", 1000)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    labels = LINES + ["ceiling"]
    width = 0.8 / len(labels)
    drawn = 0
    for i, lbl in enumerate(labels):
        xs, ys = [], []
        for j, sz in enumerate(sizes):
            p = next((p for p in main_pts if p["label"] == lbl and p.get("size") == sz and
                      (lbl == "ceiling" or p.get("clients") == size_clients)), None)
            # A missing value leaves a gap: a zero-height bar would read as "no writes".
            if p and num(p.get("write_amp")):
                xs.append(j + i * width)
                ys.append(p["write_amp"])
        bars = ax.bar(xs, ys, width, label=lbl, color=STYLE.get(lbl, {}).get("color", "gray"))
        ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
        drawn += len(ys)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))])
    ax.set_xticklabels([f"{sz} B" for sz in sizes])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel("bytes written per payload byte, per replica")
    ax.set_title(f"Write amplification ({size_clients} clients; ceiling: 1 writer)")
    if drawn:
        ax.legend(fontsize=8)
    else:
        no_data(ax)
    ax.grid(True, axis="y", alpha=0.3)
    fig.text(0.01, 0.01, foot, fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(os.path.join(out, "write_amp.png"), dpi=110)
    plt.close(fig)

    # Commit-point modes (piggyback paper section 6).
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = [("appends_per_sec", "transactions (appends)/s"),
              ("dev_write_reqs_per_sec", "disk write requests/s"),
              ("dev_write_mb_per_sec", "disk MB/s written"),
              ("follower_msgs_per_sec", "messages/s received by a follower")]
    for ax, (field, title) in zip(axes.flat, panels):
        drawn = 0
        for lbl, name in ((piggy, "PIGGY"), ("chorus-embedded-sync", "SYNC"),
                          ("chorus-embedded-async", "ASYNC")):
            x, y = series(pts, lbl, field)
            if x:
                ax.plot(x, y, label=name, **STYLE[lbl])
                drawn += 1
        if not drawn:
            no_data(ax)
        ax.set_ylim(bottom=0)
        ax.set_xscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("clients")
        ax.grid(True, which="both", alpha=0.3)
    # One legend: every panel has the same three lines.
    first = next((ax for ax in axes.flat if ax.get_legend_handles_labels()[0]), None)
    if first is not None:
        first.legend(fontsize=8)
    fig.suptitle("Commit-point modes: PIGGY vs SYNC vs ASYNC (512 B, embedded clients)")
    fig.text(0.01, 0.01, foot, fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    fig.savefig(os.path.join(out, "commit_modes.png"), dpi=110)
    plt.close(fig)
    print(f"plots written to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: plot.py RESULTS_DIR")
    main(sys.argv[1])
