#!/usr/bin/env bash
# How fast a lost chunk replica is rebuilt, against its rate limit (PolarFS section 5.3:
# streaming catch-up at a bounded rate). A four-node `chorus dev --storage` cluster, one
# volume of one chunk of SIZE bytes, filled by sequential writes; a node holding a replica of
# it is drained, and the move (new replica created, Replace at the chunk's leader, the
# new replica caught up from the leader's image, FinishMove) is timed from the moment
# the control plane starts it to the moment it is recorded finished, polling every
# 50 ms. The rate is SIZE over that time; the limit is `[out_of_order]
# catchup_bytes_per_sec` (64 MiB/s by default). Repeated REPEATS times (a new cluster
# each); one JSON line per repeat in OUT/points.jsonl, the median in OUT/summary.txt.
#
#   bench/rereplicate.sh [OUT]        (env: SIZE=512M REPEATS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/$(date +%F)-rereplicate}
SIZE=${SIZE:-512M}
REPEATS=${REPEATS:-3}
mkdir -p "$OUT"
cargo build --release -q -p chorus-server
BIN=$PWD/target/release/chorus
PORT=27700
CTL=127.0.0.1:$((PORT+1)),127.0.0.1:$((PORT+2)),127.0.0.1:$((PORT+3))
WORK=$(mktemp -d /var/tmp/chorus-rerep-bench.XXXXXX)
cleanup() {
  [ -f "$WORK/dev/pids" ] && kill $(cat "$WORK/dev/pids") 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
bytes=$(python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$SIZE")
: > "$OUT/points.jsonl"
for r in $(seq 1 "$REPEATS"); do
  rm -rf "$WORK/dev"
  "$BIN" dev --dir "$WORK/dev" --storage --nodes 4 --base-port $PORT --detach > "$OUT/chorus-dev.txt"
  "$BIN" volume create rr --size "$SIZE" --chunk-size "$SIZE" --control "$CTL" > /dev/null
  # Fill it: sequential 1 MiB writes, long enough to cover it at least once.
  "$BIN" volume bench rr --pattern write --bs 1M --depth 4 --seconds $(( bytes / (48 << 20) + 2 )) \
      --control "$CTL" > /dev/null
  from=$("$BIN" volume stat rr --control "$CTL" -o json | python3 -c "import json,sys; print(json.load(sys.stdin)['chunks'][0]['replicas'][-1])")
  "$BIN" node drain "$from" --control "$CTL" > /dev/null
  python3 - "$BIN" "$CTL" "$bytes" "$from" >> "$OUT/points.jsonl" <<'PY'
import json, subprocess, sys, time
bin, ctl, size, frm = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def chunk():
    out = subprocess.run([bin, "volume", "stat", "rr", "--control", ctl, "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["chunks"][0]
start = end = None
deadline = time.time() + 600
while time.time() < deadline:
    c = chunk()
    now = time.time()
    if start is None and c["moving_to"] != 0:
        start = now
    if c["moving_to"] == 0 and frm not in c["replicas"]:
        end = now
        if start is None:
            start = now  # finished between two polls: no time measured
        break
    time.sleep(0.05)
secs = (end - start) if end else None
print(json.dumps({"bytes": size, "from": frm, "seconds": secs,
                  "mib_per_sec": (size / 2**20 / secs) if secs else None}))
PY
  kill $(cat "$WORK/dev/pids"); rm -f "$WORK/dev/pids"
  sleep 1
done
python3 - "$OUT/points.jsonl" > "$OUT/summary.txt" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rates = [r["mib_per_sec"] for r in rows if r["mib_per_sec"]]
print(f"repeats {len(rows)}; MiB/s each: {[round(x, 1) for x in rates]}")
if rates:
    m = statistics.median(rates)
    print(f"median {m:.1f} MiB/s = {m / 64:.0%} of the 64 MiB/s catch-up limit")
PY
{ echo "commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), $(nproc) cores, size $SIZE"; cat "$OUT/summary.txt"; } > "$OUT/summary.tmp"
mv "$OUT/summary.tmp" "$OUT/summary.txt"
cat "$OUT/summary.txt"
