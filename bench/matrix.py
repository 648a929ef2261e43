#!/usr/bin/env python3
"""The benchmark matrix: Chorus, etcd-raft, openraft and the disk's ceiling, side by side.

Run through bench/run.sh, which builds everything first. For every point (clients, record
size) and every repeat, each system runs once, in an order rotated per repeat, so drift on
this shared machine hits all of them alike. Every system prints one JSON line in the same
schema (docs/benchmarks.md, "Result fields"); medians over repeats are reported.

Outputs in --out: raw.jsonl (every run, failures with an "error" field), summary.json,
summary.csv, machine.json, and PNG plots (bench/plot.py).
"""

import argparse
import csv
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHORUS = os.path.join(ROOT, "target", "release", "chorus")
CHORUS_BENCH = os.path.join(ROOT, "target", "release", "chorus-bench")
ETCD = os.path.join(ROOT, "bench", "peers", "etcd-raft", "run.sh")
OPENRAFT = os.path.join(ROOT, "bench", "peers", "openraft", "run.sh")

SYSTEMS = ["chorus-embedded", "chorus-grpc", "etcd-raft", "openraft", "ceiling"]
MODES = ["piggyback", "sync", "async"]
FIELDS = [
    "appends_per_sec", "mb_per_sec", "p50_us", "p99_us", "p999_us", "write_amp",
    "cpu_sec_per_million", "fsyncs_per_sec", "dev_flushes_per_sec",
    "dev_write_reqs_per_sec", "dev_write_mb_per_sec", "follower_msgs_per_sec",
]


def command(system, mode, clients, size, warmup, duration, data, out_json):
    """The command line of one run and its extra environment."""
    if system.startswith("chorus-"):
        path = system.split("-", 1)[1]
        return [CHORUS, "bench", "--local", data, "--path", path, "--clients", str(clients),
                "--size", str(size), "--warmup", str(warmup), "--duration", str(duration),
                "--commit-mode", mode, "--base-port", "7300", "-o", "json",
                "--json", out_json], {}
    if system == "etcd-raft":
        return [ETCD, data, str(clients), str(size), f"{warmup}s", f"{duration}s"], \
            {"ETCD_RAFT_BASE_PORT": "7150"}
    if system == "openraft":
        return [OPENRAFT, data, str(clients), str(size), f"{warmup}s", f"{duration}s"], \
            {"OPENRAFT_BASE_PORT": "7250"}
    if system == "ceiling":
        return [CHORUS_BENCH, "ceiling", "--dir", data, "--size", str(size), "--warmup",
                str(warmup), "--duration", str(duration), "--json", out_json], {}
    raise ValueError(system)


def run_one(system, mode, clients, size, args):
    """Runs one system at one point; returns its result dict (with "error" on failure)."""
    data = os.path.join(args.data, "run")
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(args.data, exist_ok=True)
    out_json = os.path.join(args.data, "result.json")
    if os.path.exists(out_json):
        os.remove(out_json)
    cmd, env = command(system, mode, clients, size, args.warmup, args.duration, data, out_json)
    base = {"system": system.split("-")[0] if system.startswith("chorus") else system,
            "path": system.split("-", 1)[1] if system.startswith("chorus") else
            ("direct" if system == "ceiling" else "embedded"),
            "commit_mode": mode if system.startswith("chorus") else None,
            "clients": 1 if system == "ceiling" else clients, "size": size}
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=args.warmup + args.duration + 180,
                           env={**os.environ, **env})
    except subprocess.TimeoutExpired as e:
        return {**base, "error": f"timeout after {time.time() - t0:.0f}s",
                "stderr": (e.stderr or "")[-2000:] if isinstance(e.stderr, str) else ""}
    finally:
        shutil.rmtree(data, ignore_errors=True)
    lines = [l for l in p.stdout.strip().splitlines() if l.strip().startswith("{")]
    if p.returncode != 0 or not lines:
        return {**base, "error": f"exit {p.returncode}", "stderr": p.stderr[-2000:]}
    try:
        r = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        return {**base, "error": f"bad JSON: {e}", "stderr": p.stderr[-2000:]}
    r.update({k: v for k, v in base.items() if k in ("system", "path", "commit_mode")})
    r["wall_seconds"] = time.time() - t0
    return r


def key(r):
    return (r["system"], r.get("path"), r.get("commit_mode"), r["clients"], r["size"])


def label(system, path, mode):
    if system == "chorus":
        return f"chorus-{path}" + ("" if mode in (None, "piggyback") else f"-{mode}")
    return system


def median(vals):
    vals = [v for v in vals if isinstance(v, (int, float))]
    return statistics.median(vals) if vals else None


def summarize(raw, floor):
    groups = {}
    for r in raw:
        groups.setdefault(key(r), []).append(r)
    points = []
    for k, rs in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), str(kv[0][2]), kv[0][3], kv[0][4])):
        ok = [r for r in rs if "error" not in r]
        row = {"system": k[0], "path": k[1], "commit_mode": k[2], "clients": k[3], "size": k[4],
               "label": label(k[0], k[1], k[2]), "runs": len(rs), "failed": len(rs) - len(ok)}
        for f in FIELDS:
            row[f] = median([r.get(f) for r in ok])
        points.append(row)

    def find(lbl, clients, size):
        for p in points:
            if p["label"] == lbl and p["size"] == size and (lbl == "ceiling" or p["clients"] == clients):
                return p
        return None

    ratios = []
    for p in points:
        if p["label"] not in ("chorus-embedded", "chorus-grpc"):
            continue
        row = {"label": p["label"], "clients": p["clients"], "size": p["size"]}
        for peer in ("etcd-raft", "openraft"):
            q = find(peer, p["clients"], p["size"])
            a, b = p["appends_per_sec"], q and q["appends_per_sec"]
            row[f"vs_{peer}"] = a / b if a and b else None
        c = find("ceiling", None, p["size"])
        row["vs_ceiling_mb"] = p["mb_per_sec"] / c["mb_per_sec"] if c and p["mb_per_sec"] and c["mb_per_sec"] else None
        ratios.append(row)

    speedups = []
    for lbl in sorted({p["label"] for p in points if p["label"] != "ceiling"}):
        series = sorted((p["clients"], p["appends_per_sec"]) for p in points
                        if p["label"] == lbl and p["size"] == 512 and p["appends_per_sec"])
        d = dict(series)
        row = {"label": lbl}
        row["x100_to_4000"] = d[4000] / d[100] if 100 in d and 4000 in d else None
        if len(series) >= 2:
            row["smallest_to_largest"] = series[-1][1] / series[0][1]
            row["from_clients"], row["to_clients"] = series[0][0], series[-1][0]
        speedups.append(row)

    latency_target = None
    if floor:
        one = find("chorus-embedded", 1, 512)
        if one and one["p50_us"]:
            latency_target = {"floor_us": floor["floor_us"], "chorus_embedded_p50_us": one["p50_us"],
                              "ratio": one["p50_us"] / floor["floor_us"]}
        g = find("chorus-grpc", 1, 512)
        if g and g["p50_us"] and latency_target is not None:
            latency_target["chorus_grpc_p50_us"] = g["p50_us"]
            latency_target["grpc_ratio"] = g["p50_us"] / floor["floor_us"]
    return {"points": points, "ratios": ratios, "speedups": speedups, "floor": floor,
            "latency_target": latency_target}


def fmt(v, digits=0):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def print_table(s):
    hdr = ["system", "clients", "size", "appends/s", "MB/s", "p50 µs", "p99 µs", "p999 µs",
           "WA", "fsync/s", "dev flush/s", "CPU s/M", "failed"]
    rows = [[p["label"], fmt(p["clients"]), fmt(p["size"]), fmt(p["appends_per_sec"]),
             fmt(p["mb_per_sec"], 1), fmt(p["p50_us"]), fmt(p["p99_us"]), fmt(p["p999_us"]),
             fmt(p["write_amp"], 2), fmt(p["fsyncs_per_sec"]), fmt(p["dev_flushes_per_sec"]),
             fmt(p["cpu_sec_per_million"], 1), f"{p['failed']}/{p['runs']}"]
            for p in sorted(s["points"], key=lambda p: (p["size"], p["clients"], p["label"]))]
    table(hdr, rows)
    print()
    table(["chorus", "clients", "size", "× etcd-raft", "× openraft", "of ceiling MB/s"],
          [[r["label"], fmt(r["clients"]), fmt(r["size"]), fmt(r["vs_etcd-raft"], 2),
            fmt(r["vs_openraft"], 2), fmt(r["vs_ceiling_mb"], 3)]
           for r in sorted(s["ratios"], key=lambda r: (r["label"], r["size"], r["clients"]))])
    print()
    table(["system", "speedup 100→4000 clients", "smallest→largest"],
          [[r["label"], fmt(r["x100_to_4000"], 2),
            (f"{fmt(r.get('smallest_to_largest'), 2)} ({r.get('from_clients')}→{r.get('to_clients')})"
             if r.get("smallest_to_largest") else "-")] for r in s["speedups"]])
    if s.get("latency_target"):
        t = s["latency_target"]
        print(f"\nlatency floor (fdatasync p50 + 2 loopback RTT): {t['floor_us']:.0f} µs; "
              f"chorus-embedded 1-client p50 {t['chorus_embedded_p50_us']} µs = {t['ratio']:.2f}× floor"
              + (f"; chorus-grpc {t['chorus_grpc_p50_us']} µs = {t['grpc_ratio']:.2f}×" if "grpc_ratio" in t else ""))


def table(hdr, rows):
    w = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)] if rows else [len(h) for h in hdr]
    print("  ".join(h.rjust(n) for h, n in zip(hdr, w)))
    for r in rows:
        print("  ".join(str(x).rjust(n) for x, n in zip(r, w)))


def machine():
    def sh(*c):
        try:
            return subprocess.run(c, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return None
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), None)
        with open("/proc/meminfo") as f:
            mem = f.readline().split()[1]
    except OSError:
        mem = None
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "nproc": os.cpu_count(),
            "cpu": cpu, "mem_kib": mem, "kernel": platform.release(),
            "commit": sh("git", "rev-parse", "HEAD"), "dirty": bool(sh("git", "status", "--porcelain"))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="one short point per system and mode")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", default="1,10,100,1000,4000", help="client counts at 512 B")
    ap.add_argument("--sizes", default="64,4096", help="extra record sizes, at --size-clients")
    ap.add_argument("--size-clients", type=int, default=1000)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--mode-clients", default="1,10,100,1000", help="client counts of the commit-mode comparison")
    ap.add_argument("--no-modes", action="store_true")
    ap.add_argument("--modes-only", action="store_true")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--data", default="/tmp/chorus-bench-matrix")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            ap.error(f"--systems: unknown system {s!r} (known: {', '.join(SYSTEMS)})")
    clients = [int(c) for c in args.clients.split(",") if c]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    mode_clients = [int(c) for c in args.mode_clients.split(",") if c]
    if args.smoke:
        args.repeats, args.warmup, args.duration = 1, 1.0, 2.0
        clients, sizes, mode_clients = [10], [], [10]
    out = args.out or os.path.join(ROOT, "bench", "results",
                                   datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)

    # The plan: (system, mode, clients, size) per point; the ceiling once per size.
    points = []
    if not args.modes_only:
        for c in clients:
            points.append((c, 512))
        for sz in sizes:
            points.append((args.size_clients, sz))
    plan = []
    for rep in range(args.repeats):
        for i, (c, sz) in enumerate(points):
            rot = (rep + i) % max(1, len(systems))
            order = systems[rot:] + systems[:rot]
            for s in order:
                if s == "ceiling" and any(p[1] == sz for p in points[:i]):
                    continue  # once per size per repeat
                plan.append((s, "piggyback", c, sz))
        if not args.no_modes and "chorus-embedded" in systems:
            for j, c in enumerate(mode_clients):
                rot = (rep + j) % len(MODES)
                for m in MODES[rot:] + MODES[:rot]:
                    if m == "piggyback" and c in clients and not args.modes_only:
                        continue  # the main matrix already ran it
                    plan.append(("chorus-embedded", m, c, 512))

    floor = None
    try:
        p = subprocess.run([CHORUS_BENCH, "floor", "--dir", os.path.join(args.data, "floor")],
                           capture_output=True, text=True, timeout=120)
        floor = json.loads(p.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        print(f"latency floor not measured: {e}", file=sys.stderr)

    raw = []
    with open(os.path.join(out, "raw.jsonl"), "w") as f:
        for n, (s, m, c, sz) in enumerate(plan, 1):
            r = run_one(s, m, c, sz, args)
            raw.append(r)
            f.write(json.dumps(r) + "\n")
            f.flush()
            what = f"{r['appends_per_sec']:,.0f} appends/s" if "error" not in r else f"FAILED: {r['error']}"
            print(f"[{n}/{len(plan)}] {s}{'' if m == 'piggyback' else ' ' + m} clients={c} size={sz}: {what}",
                  file=sys.stderr)
    s = summarize(raw, floor)
    s["machine"] = machine()
    s["args"] = vars(args)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    with open(os.path.join(out, "machine.json"), "w") as f:
        json.dump(s["machine"], f, indent=1)
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "system", "path", "commit_mode", "clients", "size", "runs", "failed"] + FIELDS)
        for p in s["points"]:
            w.writerow([p["label"], p["system"], p["path"], p["commit_mode"], p["clients"], p["size"],
                        p["runs"], p["failed"]] + [p[k] for k in FIELDS])
    print_table(s)
    print(f"\nresults in {out}")
    if not args.no_plots:
        py = os.path.join(ROOT, "bench", ".venv", "bin", "python")
        r = subprocess.run([py if os.path.exists(py) else sys.executable,
                            os.path.join(ROOT, "bench", "plot.py"), out])
        if r.returncode != 0:
            print("plots failed (see above)", file=sys.stderr)
    failed = sum(1 for r in raw if "error" in r)
    if failed:
        print(f"{failed} of {len(raw)} runs failed; see raw.jsonl", file=sys.stderr)
        for r in raw:
            if "error" in r:
                print(f"  {r['system']} {r.get('path')} clients={r['clients']} size={r['size']}: "
                      f"{r['error']}\n    {r.get('stderr', '')[-400:]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
