#!/usr/bin/env bash
# Run a 3-process openraft cluster on loopback and print the leader's result JSON.
#
#   run.sh DATA_ROOT CLIENTS SIZE [WARMUP] [DURATION] [EXTRA NODE-1 ARGS...]
#
# Extra arguments go to node 1 only, e.g. `--batch 1024` (application-level batching, off by
# default).
# WARMUP/DURATION: "2s", "500ms" or plain seconds (default 2s / 10s).
# Ports: OPENRAFT_BASE_PORT (default 7201) -> BASE, BASE+1, BASE+2.
# OPENRAFT_HOST overrides the loopback address (default 127.0.0.1).
# OPENRAFT_STRACE=FILE runs every node under `strace -f -c -e trace=fdatasync -o FILE.nN`.
# OPENRAFT_VERIFY=1: after the run, node 1 checks that every acknowledged write is in at least
# 2 of the 3 nodes' log files, and the check's line is printed to stderr.
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

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
(cd "$HERE" && cargo build --release --quiet)
BIN="${CARGO_TARGET_DIR:-$HERE/target}/release/openraft-peer"

HOST=${OPENRAFT_HOST:-127.0.0.1}
BASE=${OPENRAFT_BASE_PORT:-7201}
PEERS="$HOST:$BASE,$HOST:$((BASE + 1)),$HOST:$((BASE + 2))"

mkdir -p "$DATA_ROOT"
DATA_ROOT=$(cd "$DATA_ROOT" && pwd)
rm -rf "$DATA_ROOT"/n1 "$DATA_ROOT"/n2 "$DATA_ROOT"/n3
mkdir -p "$DATA_ROOT"/n1 "$DATA_ROOT"/n2 "$DATA_ROOT"/n3
OUT="$DATA_ROOT/result.json"
rm -f "$OUT"

WRAP=()
if [[ -n ${OPENRAFT_STRACE:-} ]]; then
  WRAP=(strace -f -c -e trace=fdatasync -o)
fi
wrap() { # wrap NODE CMD...
  local n=$1; shift
  if [[ ${#WRAP[@]} -gt 0 ]]; then exec "${WRAP[@]}" "$OPENRAFT_STRACE.n$n" "$@"; else exec "$@"; fi
}

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

# Followers first; node 1 waits until both listen, then initializes the cluster.
for id in 2 3; do
  wrap "$id" "$BIN" --id "$id" --peers "$PEERS" --data "$DATA_ROOT/n$id" >"$DATA_ROOT/n$id.log" 2>&1 &
  PIDS+=($!)
done
VERIFY=()
if [[ -n ${OPENRAFT_VERIFY:-} ]]; then
  VERIFY=(--verify-logs "$DATA_ROOT/n1,$DATA_ROOT/n2,$DATA_ROOT/n3")
fi
wrap 1 "$BIN" --id 1 --peers "$PEERS" --data "$DATA_ROOT/n1" \
  --clients "$CLIENTS" --size "$SIZE" --warmup "$WARMUP" --duration "$DURATION" \
  --sample-pids "${PIDS[0]},${PIDS[1]}" --out "$OUT" "${VERIFY[@]}" "${@:6}" >"$DATA_ROOT/n1.log" 2>&1 &
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
grep -E '^(check|verify):' "$DATA_ROOT/n1.log" >&2 || true
cat "$OUT"
