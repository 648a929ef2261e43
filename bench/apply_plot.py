#!/usr/bin/env python3
"""Plot of `chorus-bench ooo --apply-us N` runs that differ only in `--apply-threads`:
`apply_plot.py OUT.png DIR...` reads results.json in each DIR (one run per thread count)
and draws, per YCSB point (clients, θ), dependent's follower staleness and the fraction
of the interval's records the slower follower had applied by the point's end, against
dependent's apply threads, with ordered (one replay thread whatever the setting) as a
dashed line at its median over the runs. Medians over repeats, as the runs report them.

Run with the venv bench/run.sh creates (matplotlib pinned in bench/requirements.txt):
    bench/.venv/bin/python bench/apply_plot.py bench/results/2026-11-25-ooo-l/apply_cost.png \\
        bench/results/2026-11-25-ooo-l/apply50-threads*
"""

import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(dirs):
    """{(clients, θ): {system: {threads: median row}}} and the apply cost in µs."""
    out, cost = {}, None
    for d in dirs:
        with open(os.path.join(d, "results.json")) as f:
            res = json.load(f)
        s = res["settings"]
        if cost not in (None, s["apply_us"]):
            sys.exit(f"{d}: --apply-us {s['apply_us']}, the others {cost}")
        cost = s["apply_us"]
        for m in res["medians"]:
            key = (m["clients"], m["theta"])
            out.setdefault(key, {}).setdefault(m["system"], {})[s["apply_threads"]] = m
    return out, cost


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    png, dirs = sys.argv[1], sys.argv[2:]
    data, cost = load(dirs)
    keys = sorted(data)
    fig, axes = plt.subplots(2, len(keys), figsize=(4.2 * len(keys), 6.5), squeeze=False)
    for col, key in enumerate(keys):
        by = data[key]
        stale_ax, applied_ax = axes[0][col], axes[1][col]
        dep = by.get("dependent", {})
        threads = sorted(dep)
        # Staleness in ms; a point whose followers applied almost nothing is drawn
        # hollow (its median is of the few records applied).
        for t in threads:
            m = dep[t]
            s, a = m.get("staleness_median_us"), m.get("applied_by_end_min") or 0.0
            if s is not None:
                stale_ax.plot(
                    [t], [max(s, 1.0) / 1e3], "^", color="#2ca02c",
                    fillstyle="full" if a >= 0.5 else "none", markersize=8,
                )
        stale_ax.plot(
            threads,
            [max(dep[t].get("staleness_median_us") or 1.0, 1.0) / 1e3 for t in threads],
            color="#2ca02c", label="dependent",
        )
        applied_ax.plot(
            threads, [100 * (dep[t].get("applied_by_end_min") or 0.0) for t in threads],
            "^-", color="#2ca02c", label="dependent",
        )
        ordered = list(by.get("ordered", {}).values())
        o_stale = [m["staleness_median_us"] for m in ordered if m.get("staleness_median_us")]
        o_applied = [m.get("applied_by_end_min") or 0.0 for m in ordered]
        if o_stale:
            stale_ax.axhline(
                statistics.median(o_stale) / 1e3, color="#1f77b4", linestyle="--",
                label="ordered (1 replay thread)",
            )
        if o_applied:
            applied_ax.axhline(
                100 * statistics.median(o_applied), color="#1f77b4", linestyle="--",
                label="ordered (1 replay thread)",
            )
        clients, theta = key
        stale_ax.set_title(f"{clients} clients, θ {theta}")
        stale_ax.set_yscale("log")
        stale_ax.set_ylabel("follower staleness p50, ms")
        applied_ax.set_ylabel("applied by the end, slower follower, %")
        applied_ax.set_ylim(-5, 105)
        for ax in (stale_ax, applied_ax):
            ax.set_xlabel("dependent apply threads (0: the driver)")
            ax.set_xticks(threads)
            ax.grid(True, alpha=0.3)
        stale_ax.legend(fontsize=8)
    fig.suptitle(
        f"Apply at {cost} µs a record: follower staleness and backlog "
        "(hollow: under half applied)"
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
