#!/usr/bin/env bash
# Run a 3-process etcd-raft cluster on loopback and print the leader's result JSON.
#
#   run.sh DATA_ROOT CLIENTS SIZE [WARMUP] [DURATION]
#
# WARMUP/DURATION are Go durations ("2s", "500ms") or plain seconds (default 2s / 10s).
# Ports: ETCD_RAFT_BASE_PORT (default 7101) -> BASE, BASE+1, BASE+2. If any of them is
# taken and ETCD_RAFT_BASE_PORT was not set, the next free block of three is used.
# ETCD_RAFT_HOST overrides the loopback address (default 127.0.0.1).
set -euo pipefail

if [[ $# -lt 3 ]]; then
  echo "usage: $0 DATA_ROOT CLIENTS SIZE [WARMUP] [DURATION]" >&2
  exit 2
fi
DATA_ROOT=$1
CLIENTS=$2
SIZE=$3
WARMUP=${4:-2s}
DURATION=${5:-10s}
[[ $WARMUP =~ ^[0-9]+$ ]] && WARMUP="${WARMUP}s"
[[ $DURATION =~ ^[0-9]+$ ]] && DURATION="${DURATION}s"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN="$HERE/bin/etcd-raft-peer"
HOST=${ETCD_RAFT_HOST:-127.0.0.1}

(cd "$HERE" && go build -o "$BIN" .)

port_busy() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }
BASE=${ETCD_RAFT_BASE_PORT:-7101}
if [[ -z ${ETCD_RAFT_BASE_PORT:-} ]]; then
  for _ in $(seq 1 50); do
    if port_busy "$BASE" || port_busy $((BASE + 1)) || port_busy $((BASE + 2)); then
      BASE=$((BASE + 3))
    else
      break
    fi
  done
fi
PEERS="$HOST:$BASE,$HOST:$((BASE + 1)),$HOST:$((BASE + 2))"

mkdir -p "$DATA_ROOT"
DATA_ROOT=$(cd "$DATA_ROOT" && pwd)
rm -rf "$DATA_ROOT"/n1 "$DATA_ROOT"/n2 "$DATA_ROOT"/n3
OUT="$DATA_ROOT/result.json"
rm -f "$OUT"

PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Followers first, then the leader (which campaigns once everyone is connected).
for id in 2 3; do
  "$BIN" --id "$id" --peers "$PEERS" --data "$DATA_ROOT/n$id" >"$DATA_ROOT/n$id.log" 2>&1 &
  PIDS+=($!)
done
"$BIN" --id 1 --peers "$PEERS" --data "$DATA_ROOT/n1" \
  --clients "$CLIENTS" --size "$SIZE" --warmup "$WARMUP" --duration "$DURATION" \
  --sample-pids "${PIDS[0]},${PIDS[1]}" --out "$OUT" >"$DATA_ROOT/n1.log" 2>&1 &
LEADER=$!
PIDS+=("$LEADER")

rc=0
wait "$LEADER" || rc=$?
if [[ $rc -ne 0 || ! -s $OUT ]]; then
  echo "leader failed (exit $rc); logs:" >&2
  tail -n 20 "$DATA_ROOT"/n1.log "$DATA_ROOT"/n2.log "$DATA_ROOT"/n3.log >&2 || true
  exit 1
fi
cat "$OUT"
