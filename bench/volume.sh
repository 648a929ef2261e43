#!/usr/bin/env bash
# The storage layer side by side with its baselines, in one run on this machine
# (PolarFS section 8, Figs. 9-10, with FIO):
#   chorus   a volume on a three-node `chorus dev --storage` cluster (3 replicas, durable:
#            a write is acknowledged once committed on a majority), driven through the
#            routing client by `chorus volume bench`;
#   ext4     a local file on the same disk with fio, O_DIRECT, once with fdatasync after
#            every write (the durable floor) and once without (the paper's ext4);
#   gluster  GlusterFS replica 3 (three bricks on this disk) through its FUSE mount, fio
#            with fdatasync after every write (durable, like chorus), when glusterd is
#            installed (Debian: glusterfs-server).
# Workloads: 4 KiB random write and read, 128 KiB and 1 MiB sequential write, at each
# depth. Results: one JSON line per point in OUT/*.jsonl and a table in OUT/summary.txt.
#
#   bench/volume.sh [OUT]        (env: SECS=10 DEPTHS=1,4,16,32 SIZE=2G SYSTEMS="chorus ext4 gluster"
#                                       SCRUB=16M: the chorus cluster's scrub rate, 0 for none)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/$(date +%F)-volume}
SECS=${SECS:-10}
DEPTHS=${DEPTHS:-1,4,16,32}
SIZE=${SIZE:-2G}
SYSTEMS=${SYSTEMS:-chorus ext4 gluster}
SCRUB=${SCRUB:-16M}
want() { [[ " $SYSTEMS " == *" $1 "* ]]; }
mkdir -p "$OUT"
command -v fio >/dev/null || { echo "fio is needed (apt-get install fio)"; exit 2; }
cargo build --release -q -p chorus-server
BIN=$PWD/target/release/chorus
WORK=$(mktemp -d /var/tmp/chorus-volume-bench.XXXXXX)
PORT=27600
CTL=127.0.0.1:$((PORT+1)),127.0.0.1:$((PORT+2)),127.0.0.1:$((PORT+3))
cleanup() {
  [ -f "$WORK/dev/pids" ] && kill $(cat "$WORK/dev/pids") 2>/dev/null || true
  if mountpoint -q "$WORK/gmnt" 2>/dev/null; then umount "$WORK/gmnt" || true; fi
  if command -v gluster >/dev/null && gluster volume info chorusbench >/dev/null 2>&1; then
    gluster --mode=script volume stop chorusbench force >/dev/null 2>&1 || true
    gluster --mode=script volume delete chorusbench >/dev/null 2>&1 || true
  fi
  # glusterd only if this run started it (it daemonizes: its pid was noted).
  [ -n "${GLUSTERD_PID:-}" ] && kill "$GLUSTERD_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
{
  echo "commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), $(nproc) cores"
  echo "secs per point $SECS, depths $DEPTHS, size $SIZE, systems $SYSTEMS, chorus scrub rate $SCRUB"
} > "$OUT/summary.txt"

# fio JSON -> one line per point, in the same shape as `chorus volume bench -o json`.
fio_point() { # system pattern bs depth file.json (kept as OUT/fio/SYSTEM-PATTERN-BS-DEPTH.json)
  mkdir -p "$OUT/fio"
  cp "$5" "$OUT/fio/$1-$2-$3-$4.json"
  python3 - "$@" <<'PY'
import json, sys
system, pattern, bs, depth, path = sys.argv[1:6]
j = json.load(open(path))["jobs"][0]
side = j["write"] if "write" in pattern or pattern == "write" else j["read"]
iops = side["iops"]
clat = side.get("clat_ns", {}).get("percentile", {})
# With --fdatasync=1 fio times each write and its fdatasync apart (clat_ns excludes the
# sync; "sync" holds the fdatasync latencies): an I/O's latency is the two added. The
# p50 and p99 given are the sums of the two percentiles (a write and its sync are not
# paired in fio's output); mean_us is exact.
sync = j.get("sync", {})
# (fio leaves sync.total_ios at 0; lat_ns.N counts the syncs.)
sync_lat = sync.get("lat_ns", {}) if sync.get("lat_ns", {}).get("N", 0) else {}
spct = sync_lat.get("percentile", {})
lat = lambda q: int((clat.get(q, 0) + spct.get(q, 0)) / 1000)
mean_us = (side.get("clat_ns", {}).get("mean", 0) + sync_lat.get("mean", 0)) / 1000
print(json.dumps({"system": system, "pattern": pattern, "bs": int(bs), "depth": int(depth),
  "iops": iops, "mib_per_sec": side["bw_bytes"] / 2**20,
  "p50_us": lat("50.000000"), "p99_us": lat("99.000000"), "mean_us": round(mean_us, 1)}))
PY
}

size_bytes() { python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"; }

# Each workload: (pattern, bs).
WORKLOADS="randwrite:4K randread:4K write:128K write:1M"

# --- chorus ---
if want chorus; then
"$BIN" dev --dir "$WORK/dev" --storage --nodes 3 --base-port $PORT --scrub-rate "$SCRUB" --detach > "$OUT/chorus-dev.txt"
"$BIN" volume create bench --size "$SIZE" --chunk-size 1G --control "$CTL" >> "$OUT/chorus-dev.txt"
for w in $WORKLOADS; do
  p=${w%%:*}; bs=${w##*:}
  if [ "$p" = randread ]; then
    # Reads of written blocks: fill the span once first.
    "$BIN" volume bench bench --pattern write --bs 1M --depth 4 --seconds "$SECS" --control "$CTL" > /dev/null
  fi
  "$BIN" volume bench bench --pattern "$p" --bs "$bs" --depth "$DEPTHS" --seconds "$SECS" \
      --control "$CTL" -o json | sed 's/^{/{"system":"chorus",/' >> "$OUT/points.jsonl"
done
kill $(cat "$WORK/dev/pids"); rm -f "$WORK/dev/pids"
fi

# --- ext4 ---
if want ext4; then
F=$WORK/ext4.file
fallocate -l "$SIZE" "$F"
for w in $WORKLOADS; do
  p=${w%%:*}; bs=${w##*:}
  for d in ${DEPTHS//,/ }; do
    fio --name=ext4 --filename="$F" --size="$SIZE" --direct=1 --rw="$p" --bs="$bs" \
        --ioengine=libaio --iodepth="$d" --time_based --runtime="$SECS" --ramp_time=1 \
        --output-format=json > "$WORK/f.json"
    fio_point ext4 "$p" "$(size_bytes "$bs")" "$d" "$WORK/f.json" >> "$OUT/points.jsonl"
    if [ "$p" != randread ]; then
      fio --name=ext4s --filename="$F" --size="$SIZE" --direct=1 --rw="$p" --bs="$bs" \
          --ioengine=psync --fdatasync=1 --numjobs="$d" --group_reporting --time_based \
          --runtime="$SECS" --ramp_time=1 --output-format=json > "$WORK/f.json"
      fio_point ext4-fdatasync "$p" "$(size_bytes "$bs")" "$d" "$WORK/f.json" >> "$OUT/points.jsonl"
    fi
  done
done
rm -f "$F"
fi

# --- GlusterFS replica 3 ---
if want gluster && command -v glusterd >/dev/null; then
  if ! pgrep -x glusterd >/dev/null; then
    glusterd
    sleep 2
    GLUSTERD_PID=$(pgrep -x glusterd)
  fi
  H=$(hostname)
  mkdir -p "$WORK/b1" "$WORK/b2" "$WORK/b3" "$WORK/gmnt"
  gluster --mode=script volume create chorusbench replica 3 \
      "$H:$WORK/b1" "$H:$WORK/b2" "$H:$WORK/b3" force > /dev/null
  gluster --mode=script volume start chorusbench > /dev/null
  mount -t glusterfs "$H:/chorusbench" "$WORK/gmnt"
  G=$WORK/gmnt/file
  fallocate -l "$SIZE" "$G" 2>/dev/null || dd if=/dev/zero of="$G" bs=1M count=$(( $(size_bytes "$SIZE") >> 20 )) status=none
  for w in $WORKLOADS; do
    p=${w%%:*}; bs=${w##*:}
    for d in ${DEPTHS//,/ }; do
      extra="--fdatasync=1"; [ "$p" = randread ] && extra=""
      fio --name=gluster --filename="$G" --size="$SIZE" --rw="$p" --bs="$bs" \
          --ioengine=psync $extra --numjobs="$d" --group_reporting --time_based \
          --runtime="$SECS" --ramp_time=1 --output-format=json > "$WORK/f.json"
      fio_point gluster "$p" "$(size_bytes "$bs")" "$d" "$WORK/f.json" >> "$OUT/points.jsonl"
    done
  done
fi

python3 - "$OUT/points.jsonl" >> "$OUT/summary.txt" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'system':16}{'pattern':11}{'bs':>9}{'depth':>6}{'IOPS':>10}{'MiB/s':>9}{'p50 us':>9}{'p99 us':>9}")
for r in rows:
    print(f"{r['system']:16}{r['pattern']:11}{r['bs']:>9}{r['depth']:>6}{r['iops']:>10.0f}"
          f"{r['mib_per_sec']:>9.1f}{r['p50_us']:>9}{r['p99_us']:>9}")
PY
cat "$OUT/summary.txt"
