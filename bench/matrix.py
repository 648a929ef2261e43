#!/usr/bin/env python3
"""The benchmark matrix: Chorus, etcd-raft, openraft, raft-rs and the disk's ceiling, side by side.

Run through bench/run.sh, which builds everything first. For every point (clients, record
size) and every repeat, each system runs once, in an order rotated per repeat and point, so
drift on this shared machine hits all of them alike; the disk's ceiling runs once per
record size per repeat. Then the commit-point comparison: Chorus (embedded clients) in the
piggyback, sync and async modes, alternating the same way. Every system prints one JSON line
in the same schema (docs/benchmarks/result-fields.md); medians over repeats are reported.

Outputs in --out: raw.jsonl (every run, failures with an "error" field and the stderr
tail), summary.json, summary.csv (medians per point, with the ratios between systems at
that point), machine.json, and PNG plots (bench/plot.py). A failed run never stops the
matrix; the exit status is 1 if any run failed.
"""

import argparse
import csv
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHORUS = os.path.join(ROOT, "target", "release", "chorus")
CHORUS_BENCH = os.path.join(ROOT, "target", "release", "chorus-bench")
ETCD = os.path.join(ROOT, "bench", "peers", "etcd-raft", "run.sh")
OPENRAFT = os.path.join(ROOT, "bench", "peers", "openraft", "run.sh")
RAFTRS = os.path.join(ROOT, "bench", "peers", "raft-rs", "run.sh")

SYSTEMS = ["chorus-embedded", "chorus-grpc-stream", "chorus-grpc", "etcd-raft", "openraft", "raft-rs",
           "ceiling"]
MODES = ["piggyback", "sync", "async"]
# Medians of these result fields are reported per point.
FIELDS = [
    "appends_per_sec", "mb_per_sec", "p50_us", "p99_us", "p999_us", "max_us", "write_amp",
    "cpu_seconds", "cpu_sec_per_million", "fsyncs_per_sec", "dev_flushes_per_sec",
    "dev_write_reqs_per_sec", "dev_write_mb_per_sec", "follower_msgs_per_sec",
]
# appends/s of the first over the second, at the same (clients, size); the ceiling at the
# same size (it has one client).
RATIOS = [
    ("chorus-embedded", "etcd-raft"), ("chorus-embedded", "openraft"), ("chorus-embedded", "raft-rs"),
    ("chorus-grpc-stream", "etcd-raft"), ("chorus-grpc-stream", "openraft"), ("chorus-grpc-stream", "raft-rs"),
    ("chorus-grpc", "etcd-raft"), ("chorus-grpc", "openraft"), ("chorus-grpc", "raft-rs"),
    ("chorus-grpc-stream", "chorus-embedded"), ("chorus-grpc", "chorus-embedded"),
    ("chorus-embedded", "ceiling"), ("chorus-grpc-stream", "ceiling"), ("chorus-grpc", "ceiling"),
    ("etcd-raft", "ceiling"), ("openraft", "ceiling"), ("raft-rs", "ceiling"),
]
# Ports: chorus uses BASE, BASE+10, BASE+20 (+ node index 0..2); the peers BASE..BASE+2.
PORTS_USED = {
    # 0: chorus bench picks free ports itself (and retries a lost one).
    "chorus": lambda b: [b + o + i for o in (0, 10, 20) for i in (1, 2, 3)] if b else [],
    "etcd-raft": lambda b: [b + i for i in range(3)],
    "openraft": lambda b: [b + i for i in range(3)],
    "raft-rs": lambda b: [b + i for i in range(3)],
}


def command(system, mode, clients, size, args, data, out_json):
    """The command line of one run and its extra environment."""
    w, d = args.warmup, args.duration
    if system.startswith("chorus-"):
        path = system.split("-", 1)[1]
        return [args.chorus_bin, "bench", "--local", data, "--path", path,
                "--clients", str(clients), "--size", str(size), "--warmup", str(w),
                "--duration", str(d), "--commit-mode", mode, "--base-port",
                str(args.chorus_port), "-o", "json", "--json", out_json], {}
    if system == "etcd-raft":
        return [ETCD, data, str(clients), str(size), f"{w}s", f"{d}s"], \
            {"ETCD_RAFT_BASE_PORT": str(args.etcd_port)}
    if system == "openraft":
        return [OPENRAFT, data, str(clients), str(size), f"{w}s", f"{d}s"], \
            {"OPENRAFT_BASE_PORT": str(args.openraft_port)}
    if system == "raft-rs":
        return [RAFTRS, data, str(clients), str(size), f"{w}s", f"{d}s"], \
            {"RAFTRS_BASE_PORT": str(args.raftrs_port)}
    if system == "ceiling":
        return [CHORUS_BENCH, "ceiling", "--dir", data, "--size", str(size), "--warmup",
                str(w), "--duration", str(d), "--json", out_json], {}
    raise ValueError(system)


def ports_of(system, args):
    if system.startswith("chorus-"):
        return PORTS_USED["chorus"](args.chorus_port)
    if system == "etcd-raft":
        return PORTS_USED["etcd-raft"](args.etcd_port)
    if system == "openraft":
        return PORTS_USED["openraft"](args.openraft_port)
    if system == "raft-rs":
        return PORTS_USED["raft-rs"](args.raftrs_port)
    return []


def busy_ports(ports):
    """The ports someone listens on. SO_REUSEADDR, as the servers set it, so a port only
    held by TIME_WAIT connections of the previous run counts as free."""
    busy = []
    for p in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                busy.append(p)
    return busy


def kill_group(p, sig):
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def last_json(stdout):
    """The last stdout line that is a JSON object (the schema says it is the last line;
    tolerating trailing noise costs nothing)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                v = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(v, dict):
                return v
    return None


def run_one(section, system, mode, clients, size, args):
    """Runs one system at one point; returns its result dict (with "error" on failure)."""
    data = os.path.join(args.data, "run")
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(args.data, exist_ok=True)
    out_json = os.path.join(args.data, "result.json")
    if os.path.exists(out_json):
        os.remove(out_json)
    cmd, env = command(system, mode, clients, size, args, data, out_json)
    chorus = system.startswith("chorus")
    base = {"section": section,
            "system": "chorus" if chorus else system,
            "path": system.split("-", 1)[1] if chorus else
            ("direct" if system == "ceiling" else "embedded"),
            "commit_mode": mode if chorus else None,
            "clients": 1 if system == "ceiling" else clients, "size": size,
            "command": " ".join(cmd)}
    # The previous run's processes may still be exiting; give them a moment, then go on
    # (a clash fails this run, which is recorded).
    ports = ports_of(system, args)
    for _ in range(20):
        if not busy_ports(ports):
            break
        time.sleep(0.5)
    else:
        print(f"  warning: ports {busy_ports(ports)} in use before {system}", file=sys.stderr)
    t0 = time.time()
    timeout = args.warmup + args.duration + args.slack
    try:
        # Its own process group: on a timeout the whole cluster (run.sh's replicas, chorus's
        # children) is killed, not just the top process, so no replica keeps the ports.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, **env}, start_new_session=True)
    except OSError as e:
        return {**base, "error": f"cannot start {cmd[0]}: {e}", "stderr": ""}
    try:
        out, err = p.communicate(timeout=timeout)
        error = None if p.returncode == 0 else f"exit {p.returncode}"
    except subprocess.TimeoutExpired:
        kill_group(p, signal.SIGTERM)
        try:
            out, err = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            kill_group(p, signal.SIGKILL)
            out, err = p.communicate()
        error = f"timeout after {time.time() - t0:.0f}s"
    except BaseException:
        kill_group(p, signal.SIGKILL)
        p.wait()
        raise
    finally:
        # Anything the run left behind in its group (a replica whose parent crashed).
        kill_group(p, signal.SIGKILL)
        shutil.rmtree(data, ignore_errors=True)
    r = last_json(out) if error is None else None
    if error is None and r is None:
        error = "no JSON line on stdout"
    if error is None and not isinstance(r.get("appends_per_sec"), (int, float)):
        error = "JSON without a numeric appends_per_sec"
    if error is not None:
        return {**base, "error": error, "stderr": (err or "")[-2000:],
                "stdout": (out or "")[-500:], "wall_seconds": time.time() - t0}
    r.update({k: v for k, v in base.items() if k in ("section", "system", "path", "commit_mode")})
    r["command"] = base["command"]
    r["wall_seconds"] = time.time() - t0
    return r


def key(r):
    return (r["section"], r["system"], r.get("path"), r.get("commit_mode"), r["clients"], r["size"])


def label(section, system, path, mode):
    """chorus-embedded / chorus-grpc / etcd-raft / openraft / raft-rs / ceiling in the main matrix;
    chorus-embedded-<mode> in the commit-mode comparison."""
    if system != "chorus":
        return system
    return f"chorus-{path}" + (f"-{mode}" if section == "modes" else "")


def median(vals):
    vals = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.median(vals) if vals else None


def div(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def summarize(raw, floor):
    groups = {}
    for r in raw:
        groups.setdefault(key(r), []).append(r)
    points = []
    for k, rs in sorted(groups.items(), key=lambda kv: tuple(str(x) if isinstance(x, str) or x is None
                                                             else f"{x:09d}" for x in kv[0])):
        ok = [r for r in rs if "error" not in r]
        row = {"section": k[0], "system": k[1], "path": k[2], "commit_mode": k[3], "clients": k[4],
               "size": k[5], "label": label(k[0], k[1], k[2], k[3]), "runs": len(rs),
               "failed": len(rs) - len(ok)}
        for f in FIELDS:
            row[f] = median([r.get(f) for r in ok])
        points.append(row)

    def find(lbl, clients, size):
        for p in points:
            if p["label"] == lbl and p["size"] == size and (lbl == "ceiling" or p["clients"] == clients):
                return p
        return None

    # One row per (clients, size) of the main matrix: every ratio at that point.
    ratios = []
    for c, sz in sorted({(p["clients"], p["size"]) for p in points
                         if p["section"] == "main" and p["label"] != "ceiling"}):
        row = {"clients": c, "size": sz}
        for a, b in RATIOS:
            pa, pb = find(a, c, sz), find(b, c, sz)
            row[f"{a}/{b}"] = div(pa and pa["appends_per_sec"], pb and pb["appends_per_sec"])
        ratios.append(row)

    # Throughput speedups of every system along the 512-byte client sweep.
    speedups = []
    for lbl in sorted({p["label"] for p in points if p["label"] != "ceiling"}):
        d = {p["clients"]: p["appends_per_sec"] for p in points
             if p["label"] == lbl and p["size"] == 512 and p["appends_per_sec"]}
        if not d:
            continue
        top = max(d)
        speedups.append({"label": lbl, "x100_to_4000": div(d.get(4000), d.get(100)),
                         "x1_to_max": div(d.get(top), d.get(1)) if top != 1 else None,
                         "max_clients": top})

    latency_target = None
    if floor and floor.get("floor_us"):
        one = find("chorus-embedded", 1, 512)
        if one and one["p50_us"]:
            latency_target = {"floor_us": floor["floor_us"], "chorus_embedded_p50_us": one["p50_us"],
                              "ratio": one["p50_us"] / floor["floor_us"]}
        g = find("chorus-grpc", 1, 512)
        if g and g["p50_us"] and latency_target is not None:
            latency_target["chorus_grpc_p50_us"] = g["p50_us"]
            latency_target["grpc_ratio"] = g["p50_us"] / floor["floor_us"]
        g = find("chorus-grpc-stream", 1, 512)
        if g and g["p50_us"] and latency_target is not None:
            latency_target["chorus_grpc_stream_p50_us"] = g["p50_us"]
            latency_target["grpc_stream_over_embedded_us"] = g["p50_us"] - one["p50_us"]
    return {"points": points, "ratios": ratios, "speedups": speedups, "floor": floor,
            "latency_target": latency_target}


def fmt(v, digits=0):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def print_table(s):
    ratio_at = {(r["clients"], r["size"]): r for r in s["ratios"]}

    def ratio(p, other):
        if p["label"] == other or p["label"] == "ceiling":
            return "-"
        r = ratio_at.get((p["clients"], p["size"]), {})
        return fmt(r.get(f"{p['label']}/{other}"), 3 if other == "ceiling" else 2)

    main = [p for p in s["points"] if p["section"] == "main"]
    print("Main matrix (medians; ratios are appends/s of this row over the other system at "
          "the same point; the ceiling has 1 client)")
    hdr = ["system", "clients", "size", "appends/s", "MB/s", "p50 µs", "p99 µs", "p999 µs",
           "WA", "fsync/s", "dev flush/s", "CPU s/M", "×etcd-raft", "×openraft", "×raft-rs", "×embedded",
           "×ceiling", "failed"]
    order = {n: i for i, n in enumerate(SYSTEMS)}
    rows = [[p["label"], fmt(p["clients"]), fmt(p["size"]), fmt(p["appends_per_sec"]),
             fmt(p["mb_per_sec"], 1), fmt(p["p50_us"]), fmt(p["p99_us"]), fmt(p["p999_us"]),
             fmt(p["write_amp"], 2), fmt(p["fsyncs_per_sec"]), fmt(p["dev_flushes_per_sec"]),
             fmt(p["cpu_sec_per_million"], 1),
             ratio(p, "etcd-raft") if p["system"] == "chorus" else "-",
             ratio(p, "openraft") if p["system"] == "chorus" else "-",
             ratio(p, "raft-rs") if p["system"] == "chorus" else "-",
             ratio(p, "chorus-embedded") if p["label"] in ("chorus-grpc", "chorus-grpc-stream") else "-",
             ratio(p, "ceiling"), f"{p['failed']}/{p['runs']}"]
            for p in sorted(main, key=lambda p: (p["size"], p["label"] != "ceiling", p["clients"],
                                                 order.get(p["label"], 99)))]
    table(hdr, rows)

    modes = [p for p in s["points"] if p["section"] == "modes"]
    if modes:
        print("\nCommit-point modes (chorus, embedded clients; medians)")
        table(["mode", "clients", "size", "appends/s", "dev write req/s", "dev MB/s",
               "follower msg/s", "fsync/s", "p50 µs", "p99 µs", "failed"],
              [[p["commit_mode"], fmt(p["clients"]), fmt(p["size"]), fmt(p["appends_per_sec"]),
                fmt(p["dev_write_reqs_per_sec"]), fmt(p["dev_write_mb_per_sec"], 1),
                fmt(p["follower_msgs_per_sec"]), fmt(p["fsyncs_per_sec"]), fmt(p["p50_us"]),
                fmt(p["p99_us"]), f"{p['failed']}/{p['runs']}"]
               for p in sorted(modes, key=lambda p: (p["size"], p["clients"],
                                                     MODES.index(p["commit_mode"])
                                                     if p["commit_mode"] in MODES else 9))])
    if any(r["x100_to_4000"] or r["x1_to_max"] for r in s["speedups"]):
        print()
        table(["system", "speedup 100→4000 clients", "speedup 1→max clients"],
              [[r["label"], fmt(r["x100_to_4000"], 2),
                f"{fmt(r['x1_to_max'], 2)} (1→{r['max_clients']})" if r["x1_to_max"] else "-"]
               for r in s["speedups"]])
    if s.get("latency_target"):
        t = s["latency_target"]
        print(f"\nlatency floor (fdatasync p50 + 2 loopback RTT): {t['floor_us']:.0f} µs; "
              f"chorus-embedded 1-client p50 {t['chorus_embedded_p50_us']} µs = {t['ratio']:.2f}× floor"
              + (f"; chorus-grpc {t['chorus_grpc_p50_us']} µs = {t['grpc_ratio']:.2f}×" if "grpc_ratio" in t else "")
              + (f"; chorus-grpc-stream {t['chorus_grpc_stream_p50_us']} µs = embedded "
                 f"{t['grpc_stream_over_embedded_us']:+.0f} µs" if "chorus_grpc_stream_p50_us" in t else ""))
        fl = s.get("floor") or {}
        if fl.get("fdatasync_pair_p50_us"):
            print(f"  (one fdatasync alone: {fl['fdatasync_p50_us']:.0f} µs p50; two at once on this one disk, "
                  f"as a leader's and a follower's meet here: {fl['fdatasync_pair_p50_us']:.0f} µs p50)")


def table(hdr, rows):
    w = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)] if rows else [len(h) for h in hdr]
    print("  ".join(h.rjust(n) for h, n in zip(hdr, w)))
    for r in rows:
        print("  ".join(str(x).rjust(n) for x, n in zip(r, w)))


def write_csv(path, s):
    ratio_at = {(r["clients"], r["size"]): r for r in s["ratios"]}
    names = [f"{a}/{b}" for a, b in RATIOS]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["section", "label", "system", "path", "commit_mode", "clients", "size", "runs",
                    "failed"] + FIELDS + names)
        for p in s["points"]:
            # The ratios of the point this row belongs to (main matrix rows only; the
            # commit-mode rows compare among themselves).
            r = ratio_at.get((p["clients"], p["size"]), {}) if p["section"] == "main" and \
                p["label"] != "ceiling" else {}
            w.writerow([p["section"], p["label"], p["system"], p["path"], p["commit_mode"],
                        p["clients"], p["size"], p["runs"], p["failed"]]
                       + [p[k] for k in FIELDS] + [r.get(n) for n in names])


def machine():
    def sh(*c):
        try:
            return subprocess.run(c, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return None
    cpu = mem = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), None)
        with open("/proc/meminfo") as f:
            mem = f.readline().split()[1]
    except (OSError, IndexError):
        pass
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "nproc": os.cpu_count(),
            "cpu": cpu, "mem_kib": mem, "kernel": platform.release(),
            "commit": sh("git", "rev-parse", "HEAD"), "dirty": bool(sh("git", "status", "--porcelain"))}


def rotate(xs, n):
    n %= max(1, len(xs))
    return xs[n:] + xs[:n]


def make_plan(args, systems, clients, sizes, modes, mode_clients):
    """(section, system, mode, clients, size) per run: for each point, for each repeat,
    every system once in an order rotated by repeat and point; the ceiling once per size
    and repeat; then the commit-mode points the same way."""
    plan = []
    points = [] if args.modes_only else list(dict.fromkeys(
        [(c, 512) for c in clients] + [(args.size_clients, sz) for sz in sizes]))
    ceiling_sizes = set()
    for i, (c, sz) in enumerate(points):
        with_ceiling = sz not in ceiling_sizes
        ceiling_sizes.add(sz)
        for rep in range(args.repeats):
            for s in rotate(systems, rep + i):
                if s != "ceiling" or with_ceiling:
                    plan.append(("main", s, "piggyback", c, sz))
    if modes and ("chorus-embedded" in systems or args.modes_only):
        # Piggyback runs again here, beside sync and async, so the three modes are
        # compared in alternating runs rather than against a run from minutes earlier.
        for j, c in enumerate(mode_clients):
            for rep in range(args.repeats):
                for m in rotate(modes, rep + j):
                    plan.append(("modes", "chorus-embedded", m, c, 512))
    return plan


def int_list(ap, name, text):
    try:
        xs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ap.error(f"{name}: expected comma-separated integers, got {text!r}")
    if any(x <= 0 for x in xs):
        ap.error(f"{name}: every value must be positive, got {text!r}")
    return xs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true",
                    help="clients 10, size 512, warm-up 1 s, 2 s measured, 1 repeat, the ceiling, "
                         "and one commit-mode point per mode (about two minutes)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", default="1,10,100,1000,4000", help="client counts at 512 B")
    ap.add_argument("--sizes", default="64,4096", help="other record sizes, at --size-clients")
    ap.add_argument("--size-clients", type=int, default=1000)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {','.join(SYSTEMS)}")
    ap.add_argument("--modes", default=",".join(MODES), help="commit-point modes to compare")
    ap.add_argument("--mode-clients", default="1,10,100,1000", help="client counts of the commit-mode comparison")
    ap.add_argument("--no-modes", action="store_true", help="skip the commit-mode comparison")
    ap.add_argument("--modes-only", action="store_true", help="only the commit-mode comparison")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    ap.add_argument("--slack", type=float, default=180.0,
                    help="seconds a run may take beyond warm-up + duration (start-up, builds) before it is killed")
    ap.add_argument("--out", default=None, help="results directory (default bench/results/<UTC time>)")
    ap.add_argument("--data", default="/tmp/chorus-bench-matrix",
                    help="scratch directory for the clusters' data (wiped per run)")
    ap.add_argument("--chorus-bin", default=CHORUS, help="the chorus binary")
    ap.add_argument("--chorus-port", type=int, default=0, help="chorus --base-port (0: free ports chosen by the OS)")
    ap.add_argument("--etcd-port", type=int, default=7150, help="ETCD_RAFT_BASE_PORT")
    ap.add_argument("--openraft-port", type=int, default=7250, help="OPENRAFT_BASE_PORT")
    ap.add_argument("--raftrs-port", type=int, default=7350, help="RAFTRS_BASE_PORT")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            ap.error(f"--systems: unknown system {s!r} (known: {', '.join(SYSTEMS)})")
    modes = [] if args.no_modes else [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            ap.error(f"--modes: unknown mode {m!r} (known: {', '.join(MODES)})")
    clients = int_list(ap, "--clients", args.clients)
    sizes = int_list(ap, "--sizes", args.sizes)
    mode_clients = int_list(ap, "--mode-clients", args.mode_clients)
    if args.repeats < 1:
        ap.error("--repeats: at least 1")
    if args.smoke:
        args.repeats, args.warmup, args.duration = 1, 1.0, 2.0
        clients, sizes, mode_clients = [10], [], [10]
    if not (0 <= args.warmup <= 3600 and 0 < args.duration <= 3600):
        ap.error("--warmup/--duration: expected 0 ≤ warm-up ≤ 3600 and 0 < duration ≤ 3600 seconds")
    out = args.out or os.path.join(ROOT, "bench", "results",
                                   datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    data_existed = os.path.exists(args.data)

    plan = make_plan(args, systems, clients, sizes, modes, mode_clients)
    est = len(plan) * (args.warmup + args.duration + 4)
    print(f"{len(plan)} runs, about {est / 60:.0f} min; results in {out}", file=sys.stderr)

    floor = None
    try:
        p = subprocess.run([CHORUS_BENCH, "floor", "--dir", os.path.join(args.data, "floor")],
                           capture_output=True, text=True, timeout=120)
        floor = json.loads(p.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        print(f"latency floor not measured: {e}", file=sys.stderr)

    raw = []
    with open(os.path.join(out, "raw.jsonl"), "w") as f:
        for n, (sec, s, m, c, sz) in enumerate(plan, 1):
            r = run_one(sec, s, m, c, sz, args)
            raw.append(r)
            f.write(json.dumps(r) + "\n")
            f.flush()
            what = f"{r['appends_per_sec']:,.0f} appends/s" if "error" not in r else f"FAILED: {r['error']}"
            print(f"[{n}/{len(plan)}] {s}{' ' + m if sec == 'modes' else ''} clients={c} size={sz}: {what}",
                  file=sys.stderr)
    shutil.rmtree(os.path.join(args.data, "floor"), ignore_errors=True)
    if not data_existed:
        shutil.rmtree(args.data, ignore_errors=True)
    s = summarize(raw, floor)
    s["machine"] = machine()
    s["args"] = vars(args)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    with open(os.path.join(out, "machine.json"), "w") as f:
        json.dump(s["machine"], f, indent=1)
    write_csv(os.path.join(out, "summary.csv"), s)
    print_table(s)
    print(f"\nresults in {out}")
    if not args.no_plots:
        py = os.path.join(ROOT, "bench", ".venv", "bin", "python")
        r = subprocess.run([py if os.path.exists(py) else sys.executable,
                            os.path.join(ROOT, "bench", "plot.py"), out])
        if r.returncode != 0:
            print("plots failed (see above)", file=sys.stderr)
    failed = [r for r in raw if "error" in r]
    if failed:
        print(f"{len(failed)} of {len(raw)} runs failed; see raw.jsonl", file=sys.stderr)
        for r in failed:
            tail = "\n    ".join((r.get("stderr") or "").strip().splitlines()[-6:])
            print(f"  {r['system']} {r.get('path')} {r.get('commit_mode') or ''} clients={r['clients']} "
                  f"size={r['size']}: {r['error']}\n    {tail}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
