#!/usr/bin/env python3
"""Plots of a `chorus-bench ooo` run: `ooo_plot.py RESULTS_DIR` reads results.json there
and writes next to it:

- block_iops.png: 4 KiB block writes, IOPS and mean latency vs IO depth (PolarFS Fig. 7);
- ycsb_clients.png: YCSB-like transactions, throughput vs clients (DP-Raft Fig. 6);
- ycsb_theta.png: throughput vs Zipf θ, absolute and normalised to ordered (Figs. 8, 9);
- apply_gap.png: follower apply gap (median and p99) per system, clients sweep (Fig. 11).

Lines are medians over repeats; the small dots are the individual repeats. Missing
points (failed runs) leave gaps; a plot with no data says so instead.

With --tables, also prints the medians and ratios as Markdown tables.

Run with the venv bench/run.sh creates (matplotlib pinned in bench/requirements.txt):
    bench/.venv/bin/python bench/ooo_plot.py bench/results/2026-11-23-ooo-b --tables
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "ordered": dict(color="#1f77b4", marker="o"),
    "parallel": dict(color="#d62728", marker="s"),
    "parallel-txn": dict(color="#ff7f0e", marker="D"),
    "dependent": dict(color="#2ca02c", marker="^"),
    "in-order": dict(color="#7f7f7f", marker="v", linestyle="--"),
    "ordered-no-repair": dict(color="#9467bd", marker="x", linestyle=":"),
}
ORDER = ["ordered", "parallel", "parallel-txn", "dependent", "in-order", "ordered-no-repair"]


def medians(res, part, x, **match):
    """{system: [(x, median row)]} of one part, sorted by x."""
    out = {}
    for m in res["medians"]:
        if m["part"] != part or any(m.get(k) != v for k, v in match.items()):
            continue
        out.setdefault(m["system"], []).append((m[x], m))
    return {s: sorted(v, key=lambda t: t[0]) for s, v in out.items()}


def raw(res, part, system, x, field, **match):
    return [(p[x], p[field]) for p in res["points"]
            if p["part"] == part and p["system"] == system and p.get("error") is None
            and all(p.get(k) == v for k, v in match.items())]


def lines(ax, res, part, x, field, **match):
    meds = medians(res, part, x, **match)
    for s in ORDER:
        if s not in meds:
            continue
        st = STYLE[s]
        xs = [a for a, _ in meds[s]]
        ys = [m[field] for _, m in meds[s]]
        ax.plot(xs, ys, label=s, **st)
        if field == "ops_per_sec":
            pts = raw(res, part, s, x, field, **match)
            ax.scatter([a for a, _ in pts], [b for _, b in pts], s=8, alpha=0.35,
                       color=st["color"])
    return bool(meds)


def empty(ax, what):
    ax.text(0.5, 0.5, f"no data for {what}", ha="center", va="center",
            transform=ax.transAxes)


def block(res, d):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    if lines(a1, res, "block", "clients", "ops_per_sec"):
        lines(a2, res, "block", "clients", "lat_mean_us")
        for a in (a1, a2):
            a.set_xscale("log", base=2)
            a.set_xlabel("IO depth (closed-loop clients)")
            a.grid(alpha=0.3)
            a.legend()
        a1.set_ylabel("committed 4 KiB writes / s")
        a1.set_ylim(bottom=0)
        a2.set_ylabel("mean commit latency (µs)")
        a2.set_ylim(bottom=0)
    else:
        empty(a1, "the block part")
    st = res["settings"]
    jit = st["jitter_ms"]
    links = "nodes 2 and 3" if st.get("jitter_links", 1) == 2 else "node 3"
    how = "frames reordered" if st.get("reorder", False) else "order kept"
    if st.get("reorder", False) and st.get("connections", 0) >= 2:
        how = f"one of {st['connections']} connections per link"
    fig.suptitle(f"4 KiB random block writes, 3 replica processes, fsync, "
                 f"0–{jit:g} ms jitter leader→{links} ({how})")
    fig.tight_layout()
    fig.savefig(os.path.join(d, "block_iops.png"), dpi=120)
    plt.close(fig)


def ycsb_clients(res, d):
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    theta = res["settings"]["theta"]
    if lines(ax, res, "ycsb-clients", "clients", "ops_per_sec"):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("clients")
        ax.set_ylabel("committed transactions / s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    else:
        empty(ax, "the clients sweep")
    ax.set_title(f"YCSB 1 read + 1 write, {res['settings']['keys']:,} keys, θ {theta}")
    fig.tight_layout()
    fig.savefig(os.path.join(d, "ycsb_clients.png"), dpi=120)
    plt.close(fig)


def ycsb_theta(res, d):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    n = res["settings"]["theta_clients"]
    if lines(a1, res, "ycsb-theta", "theta", "ops_per_sec"):
        meds = medians(res, "ycsb-theta", "theta")
        base = {t: m["ops_per_sec"] for t, m in meds.get("ordered", [])}
        for s in ORDER:
            if s not in meds or s == "ordered":
                continue
            xs = [t for t, _ in meds[s] if base.get(t)]
            ys = [m["ops_per_sec"] / base[t] for t, m in meds[s] if base.get(t)]
            a2.plot(xs, ys, label=f"{s} / ordered", **STYLE[s])
        a2.axhline(1.0, color=STYLE["ordered"]["color"], lw=1)
        a1.set_ylabel("committed transactions / s")
        a1.set_ylim(bottom=0)
        a2.set_ylabel("throughput normalised to ordered")
        for a in (a1, a2):
            a.set_xlabel("Zipf θ")
            a.grid(alpha=0.3)
            a.legend()
    else:
        empty(a1, "the θ sweep")
    fig.suptitle(f"YCSB 1 read + 1 write, {n} clients, θ swept")
    fig.tight_layout()
    fig.savefig(os.path.join(d, "ycsb_theta.png"), dpi=120)
    plt.close(fig)


def apply_gap(res, d):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    meds = medians(res, "ycsb-clients", "clients")
    systems = [s for s in ORDER if s in meds]
    xs = sorted({c for s in systems for c, _ in meds[s]})
    if systems and xs:
        w = 0.8 / len(systems)
        for a, field, title in ((a1, "gap_median_us", "median"), (a2, "gap_p99_us", "p99")):
            for i, s in enumerate(systems):
                row = dict(meds[s])
                ys = [(row[c][field] if c in row and row[c][field] is not None else 0)
                      for c in xs]
                a.bar([j + i * w for j in range(len(xs))], ys, width=w, label=s,
                      color=STYLE[s]["color"])
            a.set_xticks([j + w * (len(systems) - 1) / 2 for j in range(len(xs))])
            a.set_xticklabels([str(c) for c in xs])
            a.set_xlabel("clients")
            a.set_ylabel(f"{title} apply gap, leader → follower (µs)")
            a.set_yscale("log")
            a.grid(alpha=0.3, axis="y")
            a.legend()
    else:
        empty(a1, "the apply gap")
    fig.suptitle(f"Follower apply gap (both followers pooled), YCSB θ "
                 f"{res['settings']['theta']}")
    fig.tight_layout()
    fig.savefig(os.path.join(d, "apply_gap.png"), dpi=120)
    plt.close(fig)


def fmt(v, digits=0):
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def tables(res):
    """Markdown tables of the medians and ratios (for docs/benchmarks/out-of-order.md)."""
    med = {}
    for m in res["medians"]:
        med[(m["part"], m["clients"], m["theta"], m["system"])] = m
    ratio = {}
    for r in res["ratios"]:
        ratio[(r["part"], r["clients"], r["theta"], r["system"], r["vs"])] = r

    def ops(part, c, t, s):
        m = med.get((part, c, t, s))
        return m["ops_per_sec"] if m else None

    def pct(part, c, t, s):
        m = med.get((part, c, t, s))
        v = m.get("held_per_entry") if m else None
        return fmt(100 * v, 1) if v is not None else "–"

    def rat(part, c, t, a, b):
        r = ratio.get((part, c, t, a, b))
        return r["throughput_ratio"] if r else None

    depths = sorted({k[1] for k in med if k[0] == "block"})
    if depths:
        print("| IO depth | ordered IOPS | parallel IOPS | in-order IOPS | parallel / ordered"
              " | parallel / in-order | mean latency µs (ord / par / in-ord) |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for d in depths:
            lat = " / ".join(fmt(med[("block", d, None, s)]["lat_mean_us"])
                             if ("block", d, None, s) in med else "–"
                             for s in ("ordered", "parallel", "in-order"))
            print(f"| {d} | {fmt(ops('block', d, None, 'ordered'))} "
                  f"| {fmt(ops('block', d, None, 'parallel'))} "
                  f"| {fmt(ops('block', d, None, 'in-order'))} "
                  f"| {fmt(rat('block', d, None, 'parallel', 'ordered'), 2)} "
                  f"| {fmt(rat('block', d, None, 'parallel', 'in-order'), 2)} | {lat} |")
        print()
    for part, xs, key in (("ycsb-clients", "clients", 1), ("ycsb-theta", "θ", 2)):
        keys = sorted({(k[1], k[2]) for k in med if k[0] == part}, key=lambda t: t[key - 1])
        if not keys:
            continue
        txn = any(k[0] == part and k[3] == "parallel-txn" for k in med)
        sy = ("ordered", "parallel", "parallel-txn", "dependent") if txn else (
            "ordered", "parallel", "dependent")
        short = {"ordered": "ord", "parallel": "par", "parallel-txn": "ptx", "dependent": "dep"}
        tag = " / ".join(short[s] for s in sy)
        vs = ("parallel-txn", "parallel") if txn else ("parallel",)
        # Runs before session 21 did not count the entries the commit rule held back.
        held = int(txn and any(m.get("held_per_entry") is not None
                               for k, m in med.items() if k[0] == part))
        print(f"| {xs} | " + " | ".join(f"{s} tx/s" for s in sy) + " | dep / ordered | "
              + " | ".join(f"dep / {v}" for v in vs)
              + f" | gap p50 µs ({tag}) | gap p99 µs ({tag}) | gap lower, ordered ÷ dependent"
              + (" | entries held at commit, % (ptx / dep) |" if held else " |"))
        print("|---:|" + "---:|" * (len(sy) + 1 + len(vs) + 3 + held))
        for c, t in keys:
            def g(s, f):
                m = med.get((part, c, t, s))
                return fmt(m[f]) if m else "–"
            # Computed here rather than read from results.json: earlier runs stored a
            # ratio even when a median gap was at or below zero (a follower applying
            # before the leader), where it means nothing.
            mo, md = med.get((part, c, t, "ordered")), med.get((part, c, t, "dependent"))
            lower = (mo["gap_median_us"] / md["gap_median_us"]
                     if mo and md and (mo["gap_median_us"] or 0) > 0
                     and (md["gap_median_us"] or 0) > 0 else None)
            x = c if key == 1 else t
            print(f"| {x} | " + " | ".join(fmt(ops(part, c, t, s)) for s in sy)
                  + f" | {fmt(rat(part, c, t, 'dependent', 'ordered'), 2)} | "
                  + " | ".join(fmt(rat(part, c, t, 'dependent', v), 2) for v in vs)
                  + f" | {' / '.join(g(s, 'gap_median_us') for s in sy)} "
                  f"| {' / '.join(g(s, 'gap_p99_us') for s in sy)} "
                  f"| {fmt(lower, 2)} |"
                  + (f" {pct(part, c, t, 'parallel-txn')} / {pct(part, c, t, 'dependent')} |"
                     if held else ""))
        print()


def main():
    args = sys.argv[1:]
    want_tables = "--tables" in args
    args = [a for a in args if a != "--tables"]
    if len(args) != 1:
        sys.exit("usage: ooo_plot.py RESULTS_DIR [--tables]  (RESULTS_DIR holds results.json)")
    d = args[0]
    path = os.path.join(d, "results.json")
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"ooo_plot.py: cannot read {path}: {e}")
    block(res, d)
    ycsb_clients(res, d)
    ycsb_theta(res, d)
    apply_gap(res, d)
    if want_tables:
        tables(res)
    print(f"wrote block_iops.png, ycsb_clients.png, ycsb_theta.png, apply_gap.png in {d}")


if __name__ == "__main__":
    main()
