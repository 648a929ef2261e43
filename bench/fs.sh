#!/usr/bin/env bash
# The file system (PolarFS section 6) side by side with its baselines, in one run on this
# machine. Every system takes the same fio job (psync, one I/O at a time per job, 1 to 8
# jobs on one preallocated file; writes followed by fdatasync, so each is durable):
#   chorus-fuse    Chorus-FS mounted through FUSE (`chorus dev --storage --fs`: three
#                  replicas, a write answered once a majority holds it);
#   chorus-pfs     the same file system through the Rust API in one process (the libpfs
#                  path: `chorus fs bench`, the same pattern, threads for jobs);
#   chorus-volume  the raw volume client on a volume of its own (`chorus volume bench`,
#                  depth = jobs): what the file system adds is the difference;
#   ext4           a local file on the same disk, with fdatasync after every write
#                  (`ext4-fdatasync`) and O_DIRECT without it (`ext4`);
#   gluster        GlusterFS replica 3 (three bricks on this disk) through its FUSE mount,
#                  when glusterd is installed (Debian: glusterfs-server).
# Workloads: 4 KiB random write and read, 128 KiB and 1 MiB sequential write. Then a
# database: SQLite (Debian's sqlite3) committing TXNS transactions of ten 200-byte inserts,
# timed, on chorus-fuse, ext4 and gluster.
# With PG=1 (PostgreSQL from Debian: postgresql), also initdb timed and a pgbench run
# (scale 1, 4 clients, PG_SECS seconds) on each, as the postgres user.
# Results: one JSON line per point in OUT/points.jsonl, a table in OUT/summary.txt.
#
#   bench/fs.sh [OUT]     (env: SECS=5 JOBS=1,2,4,8 SIZE=256M TXNS=200 PG=0 PG_SECS=20
#                               SYSTEMS="chorus ext4 gluster")
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/$(date +%F)-fs}
SECS=${SECS:-5}
JOBS=${JOBS:-1,2,4,8}
SIZE=${SIZE:-256M}
TXNS=${TXNS:-200}
PG=${PG:-0}
PG_SECS=${PG_SECS:-20}
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1)
SYSTEMS=${SYSTEMS:-chorus ext4 gluster}
want() { [[ " $SYSTEMS " == *" $1 "* ]]; }
mkdir -p "$OUT"
command -v fio >/dev/null || { echo "fio is needed (apt-get install fio)"; exit 2; }
command -v sqlite3 >/dev/null || { echo "sqlite3 is needed (apt-get install sqlite3)"; exit 2; }
cargo build --release -q -p chorus-server
BIN=$PWD/target/release/chorus
WORK=$(mktemp -d /var/tmp/chorus-fs-bench.XXXXXX)
PORT=27700
CTL=127.0.0.1:$((PORT+1)),127.0.0.1:$((PORT+2)),127.0.0.1:$((PORT+3))
cleanup() {
  for d in "$WORK"/pg-*/pg "$WORK"/gmnt/pg-*/pg; do
    [ -f "$d/postmaster.pid" ] && su postgres -c "$PGBIN/pg_ctl -D $d -m immediate stop" >/dev/null 2>&1 || true
  done
  [ -n "${PGMOUNT_PID:-}" ] && kill "$PGMOUNT_PID" 2>/dev/null || true
  [ -f "$WORK/dev/pids" ] && kill $(cat "$WORK/dev/pids") 2>/dev/null || true
  sleep 1
  for m in "$WORK/mnt" "$WORK/gmnt" "$WORK/pg-chorus"; do
    if mountpoint -q "$m" 2>/dev/null; then umount -l "$m" || true; fi
  done
  if command -v gluster >/dev/null && gluster volume info chorusfsbench >/dev/null 2>&1; then
    gluster --mode=script volume stop chorusfsbench force >/dev/null 2>&1 || true
    gluster --mode=script volume delete chorusfsbench >/dev/null 2>&1 || true
  fi
  [ -n "${GLUSTERD_PID:-}" ] && kill "$GLUSTERD_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
{
  echo "commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), $(nproc) cores"
  echo "secs per point $SECS, jobs $JOBS, file size $SIZE, sqlite transactions $TXNS, systems $SYSTEMS"
} > "$OUT/summary.txt"

fio_point() { # system pattern bs jobs file.json
  mkdir -p "$OUT/fio"
  cp "$5" "$OUT/fio/$1-$2-$3-$4.json"
  python3 - "$@" <<'PY'
import json, sys
system, pattern, bs, depth, path = sys.argv[1:6]
j = json.load(open(path))["jobs"][0]
side = j["write"] if "write" in pattern else j["read"]
clat = side.get("clat_ns", {}).get("percentile", {})
# With --fdatasync=1 fio times each write and its fdatasync apart: an I/O's latency is the
# two added (percentiles summed; mean exact), as in bench/volume.sh.
sync = j.get("sync", {})
sync_lat = sync.get("lat_ns", {}) if sync.get("lat_ns", {}).get("N", 0) else {}
spct = sync_lat.get("percentile", {})
lat = lambda q: int((clat.get(q, 0) + spct.get(q, 0)) / 1000)
mean_us = (side.get("clat_ns", {}).get("mean", 0) + sync_lat.get("mean", 0)) / 1000
print(json.dumps({"system": system, "pattern": pattern, "bs": int(bs), "depth": int(depth),
  "iops": side["iops"], "mib_per_sec": side["bw_bytes"] / 2**20,
  "p50_us": lat("50.000000"), "p99_us": lat("99.000000"), "mean_us": round(mean_us, 1)}))
PY
}
size_bytes() { python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"; }
WORKLOADS="randwrite:4K randread:4K write:128K write:1M"

# fio_on SYSTEM FILE [extra fio flags]: every workload and job count on FILE.
fio_on() {
  local system=$1 file=$2; shift 2
  for w in $WORKLOADS; do
    p=${w%%:*}; bs=${w##*:}
    for j in ${JOBS//,/ }; do
      sync="--fdatasync=1"; [ "$p" = randread ] && sync=""
      fio --name="$system" --filename="$file" --size="$SIZE" --rw="$p" --bs="$bs" \
          --ioengine=psync $sync "$@" --numjobs="$j" --group_reporting --time_based \
          --runtime="$SECS" --ramp_time=1 --output-format=json > "$WORK/f.json"
      fio_point "$system" "$p" "$(size_bytes "$bs")" "$j" "$WORK/f.json" >> "$OUT/points.jsonl"
    done
  done
}

# sqlite_on SYSTEM DIR: TXNS transactions, timed (one sqlite3 process, its script on stdin).
sqlite_on() {
  local system=$1 db=$2/bench.sqlite
  rm -f "$db" "$db-journal"
  python3 - "$TXNS" > "$WORK/txns.sql" <<'PY'
import sys
print("PRAGMA journal_mode=DELETE; CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT);")
for b in range(int(sys.argv[1])):
    print("BEGIN;" + "".join(f"INSERT INTO t(v) VALUES ('{b} {i} {'x' * 200}');" for i in range(10)) + "COMMIT;")
PY
  local t0 t1
  t0=$(date +%s.%N)
  sqlite3 "$db" < "$WORK/txns.sql" > /dev/null
  t1=$(date +%s.%N)
  local rows
  rows=$(sqlite3 "$db" "PRAGMA integrity_check; SELECT count(*) FROM t;" | tr '\n' ' ')
  python3 -c "import json,sys; s=float(sys.argv[3])-float(sys.argv[2]); n=int(sys.argv[4]); print(json.dumps({'system': sys.argv[1], 'pattern': 'sqlite-txn', 'bs': 0, 'depth': 1, 'iops': n / s, 'mib_per_sec': 0, 'p50_us': 0, 'p99_us': 0, 'mean_us': round(s / n * 1e6, 1), 'check': sys.argv[5]}))" \
    "$system" "$t0" "$t1" "$TXNS" "$rows" >> "$OUT/points.jsonl"
  rm -f "$db"
}

# pg_on SYSTEM DIR PORT: initdb (timed) in DIR/pg, then pgbench; DIR is the postgres
# user's.
pg_on() {
  local system=$1 dir=$2 port=$3 t0 t1
  t0=$(date +%s.%N)
  su postgres -c "$PGBIN/initdb -D $dir/pg -A trust -U postgres" > "$OUT/pg-$system-initdb.log" 2>&1
  t1=$(date +%s.%N)
  # The server's log in DIR (the postgres user's), copied into OUT afterwards.
  su postgres -c "$PGBIN/pg_ctl -D $dir/pg -o '-k /tmp -p $port -c listen_addresses=' -l $dir/server.log -w start" > /dev/null
  su postgres -c "$PGBIN/pgbench -h /tmp -p $port -i -s 1 -q postgres" > "$OUT/pg-$system-init.log" 2>&1
  su postgres -c "$PGBIN/pgbench -h /tmp -p $port -T $PG_SECS -c 4 -j 2 postgres" > "$OUT/pg-$system-bench.log" 2>&1
  su postgres -c "$PGBIN/pg_ctl -D $dir/pg -m fast -w stop" > /dev/null
  cp "$dir/server.log" "$OUT/pg-$system.log"
  python3 - "$system" "$t0" "$t1" "$OUT/pg-$system-bench.log" >> "$OUT/points.jsonl" <<'PY'
import json, re, sys
system, t0, t1, log = sys.argv[1:5]
text = open(log).read()
tps = float(re.search(r"tps = ([0-9.]+)", text).group(1))
lat = float(re.search(r"latency average = ([0-9.]+) ms", text).group(1))
print(json.dumps({"system": system, "pattern": "pgbench-tpcb", "bs": 0, "depth": 4, "iops": tps,
  "mib_per_sec": 0, "p50_us": 0, "p99_us": 0, "mean_us": round(lat * 1000, 1),
  "check": f"initdb {float(t1) - float(t0):.1f} s"}))
PY
}
if [ "$PG" = 1 ]; then
  [ -n "$PGBIN" ] && id postgres >/dev/null 2>&1 || { echo "PG=1 needs PostgreSQL (apt-get install postgresql)"; exit 2; }
  chmod 755 "$WORK"
fi

# --- chorus ---
if want chorus; then
  mkdir -p "$WORK/mnt"
  "$BIN" dev --dir "$WORK/dev" --storage --nodes 3 --base-port $PORT --scrub-rate 0 \
      --fs "$WORK/mnt" --fs-size 1G --detach > "$OUT/chorus-dev.txt"
  fallocate -l "$SIZE" "$WORK/mnt/fio.dat"
  fio_on chorus-fuse "$WORK/mnt/fio.dat"
  sqlite_on chorus-fuse "$WORK/mnt"
  for w in $WORKLOADS; do
    p=${w%%:*}; bs=${w##*:}
    "$BIN" fs bench fs --control "$CTL" --host-id 2 --path /pfs.dat --file-size "$SIZE" \
        --pattern "$p" --bs "$bs" --jobs "$JOBS" --seconds "$SECS" -o json \
      | sed 's/^{/{"system":"chorus-pfs",/' >> "$OUT/points.jsonl"
  done
  "$BIN" volume create raw --size "$SIZE" --control "$CTL" >> "$OUT/chorus-dev.txt"
  for w in $WORKLOADS; do
    p=${w%%:*}; bs=${w##*:}
    "$BIN" volume bench raw --pattern "$p" --bs "$bs" --depth "$JOBS" --seconds "$SECS" \
        --control "$CTL" -o json | sed 's/^{/{"system":"chorus-volume",/' >> "$OUT/points.jsonl"
  done
  if [ "$PG" = 1 ]; then
    # A file system of its own, mounted for the postgres user.
    "$BIN" volume create pg --size 1G --control "$CTL" >> "$OUT/chorus-dev.txt"
    # Small blocks: a PostgreSQL cluster is a thousand small files.
    "$BIN" fs mkfs pg --control "$CTL" --block-size 64K --inodes-per-chunk 4096 \
        --dirents-per-chunk 4096 >> "$OUT/chorus-dev.txt"
    mkdir -p "$WORK/pg-chorus" && chown postgres:postgres "$WORK/pg-chorus"
    "$BIN" fs mount pg "$WORK/pg-chorus" --control "$CTL" --allow-other > "$OUT/pg-chorus-mount.log" 2>&1 &
    PGMOUNT_PID=$!
    for _ in $(seq 100); do mountpoint -q "$WORK/pg-chorus" && break; sleep 0.2; done
    pg_on chorus-fuse "$WORK/pg-chorus" 25432
    "$BIN" fs umount "$WORK/pg-chorus"; wait "$PGMOUNT_PID" || true; PGMOUNT_PID=
  fi
  kill $(cat "$WORK/dev/pids"); rm -f "$WORK/dev/pids"
  sleep 2
fi

# --- ext4 ---
if want ext4; then
  mkdir -p "$WORK/ext4"
  fallocate -l "$SIZE" "$WORK/ext4/fio.dat"
  fio_on ext4-fdatasync "$WORK/ext4/fio.dat" --direct=1
  WORKLOADS_SAVED=$WORKLOADS; WORKLOADS="randwrite:4K"
  for j in ${JOBS//,/ }; do
    fio --name=ext4 --filename="$WORK/ext4/fio.dat" --size="$SIZE" --rw=randwrite --bs=4K \
        --ioengine=psync --direct=1 --numjobs="$j" --group_reporting --time_based \
        --runtime="$SECS" --ramp_time=1 --output-format=json > "$WORK/f.json"
    fio_point ext4 randwrite 4096 "$j" "$WORK/f.json" >> "$OUT/points.jsonl"
  done
  WORKLOADS=$WORKLOADS_SAVED
  sqlite_on ext4 "$WORK/ext4"
  if [ "$PG" = 1 ]; then
    mkdir -p "$WORK/pg-ext4" && chown postgres:postgres "$WORK/pg-ext4"
    pg_on ext4 "$WORK/pg-ext4" 25433
  fi
  rm -rf "$WORK/ext4"
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
  gluster --mode=script volume create chorusfsbench replica 3 \
      "$H:$WORK/b1" "$H:$WORK/b2" "$H:$WORK/b3" force > /dev/null
  gluster --mode=script volume start chorusfsbench > /dev/null
  mount -t glusterfs "$H:/chorusfsbench" "$WORK/gmnt"
  fallocate -l "$SIZE" "$WORK/gmnt/fio.dat" 2>/dev/null \
    || dd if=/dev/zero of="$WORK/gmnt/fio.dat" bs=1M count=$(( $(size_bytes "$SIZE") >> 20 )) status=none
  fio_on gluster "$WORK/gmnt/fio.dat"
  sqlite_on gluster "$WORK/gmnt"
  if [ "$PG" = 1 ]; then
    mkdir -p "$WORK/gmnt/pg-gluster" && chown postgres:postgres "$WORK/gmnt/pg-gluster"
    pg_on gluster "$WORK/gmnt/pg-gluster" 25434
  fi
  umount "$WORK/gmnt"
fi

python3 - "$OUT/points.jsonl" >> "$OUT/summary.txt" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'system':16}{'pattern':11}{'bs':>9}{'jobs':>6}{'IOPS':>10}{'MiB/s':>9}{'p50 us':>9}{'p99 us':>9}{'mean us':>10}")
for r in rows:
    print(f"{r['system']:16}{r['pattern']:11}{r['bs']:>9}{r['depth']:>6}{r['iops']:>10.0f}"
          f"{r['mib_per_sec']:>9.1f}{r['p50_us']:>9}{r['p99_us']:>9}{r.get('mean_us', 0):>10}"
          + (f"  {r['check']}" if 'check' in r else ""))
PY
cat "$OUT/summary.txt"
