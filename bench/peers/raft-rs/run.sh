#!/usr/bin/env bash
# Run a 3-process raft-rs + raft-engine cluster on loopback and print node 1's result JSON.
#
#   run.sh DATA_ROOT CLIENTS SIZE [WARMUP] [DURATION] [EXTRA NODE-1 ARGS...]
#
# WARMUP/DURATION: "2s", "500ms" or plain seconds (default 2s / 10s).
# Ports: RAFTRS_BASE_PORT (default 7301) -> BASE, BASE+1, BASE+2, on RAFTRS_HOST
# (default 127.0.0.1).
# RAFTRS_VERIFY=1: node 1 lists every acknowledged append, and once the cluster has stopped
# each one is checked to be in a majority of the three raft-engine logs (result on stderr;
# a failed check fails the script).
set -euo pipefail

if [[ $# -lt 3 ]]; then
  echo "usage: $0 DATA_ROOT CLIENTS SIZE [WARMUP] [DURATION] [EXTRA NODE-1 ARGS...]" >&2
  exit 2
fi
DATA_ROOT=$1
CLIENTS=$2
SIZE=$3
WARMUP=${4:-2s}
DURATION=${5:-10s}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
(cd "$HERE" && cargo build --release --locked --quiet)
BIN="${CARGO_TARGET_DIR:-$HERE/target}/release/raftrs-peer"

HOST=${RAFTRS_HOST:-127.0.0.1}
BASE=${RAFTRS_BASE_PORT:-7301}
PEERS="$HOST:$BASE,$HOST:$((BASE + 1)),$HOST:$((BASE + 2))"

mkdir -p "$DATA_ROOT"
DATA_ROOT=$(cd "$DATA_ROOT" && pwd)
rm -rf "$DATA_ROOT"/n1 "$DATA_ROOT"/n2 "$DATA_ROOT"/n3
mkdir -p "$DATA_ROOT"/n1 "$DATA_ROOT"/n2 "$DATA_ROOT"/n3
OUT="$DATA_ROOT/result.json"
ACKED="$DATA_ROOT/acked.txt"
rm -f "$OUT" "$ACKED"
VERIFY=()
if [[ ${RAFTRS_VERIFY:-0} == 1 ]]; then
  VERIFY=(--acked-out "$ACKED")
fi

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

# Followers first; node 1 campaigns once it is connected to both.
for id in 2 3; do
  "$BIN" --id "$id" --peers "$PEERS" --data "$DATA_ROOT/n$id" >"$DATA_ROOT/n$id.log" 2>&1 &
  PIDS+=($!)
done
"$BIN" --id 1 --peers "$PEERS" --data "$DATA_ROOT/n1" \
  --clients "$CLIENTS" --size "$SIZE" --warmup "$WARMUP" --duration "$DURATION" \
  --sample-pids "${PIDS[0]},${PIDS[1]}" --out "$OUT" "${VERIFY[@]}" "${@:6}" \
  >"$DATA_ROOT/n1.log" 2>&1 &
LEADER=$!
PIDS+=("$LEADER")

rc=0
wait "$LEADER" || rc=$?
if [[ $rc -ne 0 || ! -s $OUT ]]; then
  echo "node 1 failed (exit $rc); logs:" >&2
  tail -n 20 "$DATA_ROOT"/n1.log "$DATA_ROOT"/n2.log "$DATA_ROOT"/n3.log >&2 || true
  exit 1
fi
cleanup
PIDS=()
if [[ ${#VERIFY[@]} -gt 0 ]]; then
  echo "verify: $("$BIN" --verify-acked "$ACKED" \
    --verify-dirs "$DATA_ROOT/n1,$DATA_ROOT/n2,$DATA_ROOT/n3")" >&2
fi
cat "$OUT"
