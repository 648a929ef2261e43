#!/usr/bin/env bash
# Recovery of a follower cut off until 1 GiB behind, per mode (three nodes, release build,
# 8 writers of 64 KiB records; docs/reliability.md). Needs root (network namespaces).
# REPS=N repeats (default 2), modes alternating.
set -euo pipefail
OUT=${OUT:-bench/results/2026-12-06-catch-up}
REPS=${REPS:-2}
for rep in $(seq 1 "$REPS"); do
  for mode in ordered parallel dependent; do
    target/release/chorus-nemesis --catch-up-mib 1024 --writers 8 --workload "$mode" \
      --out "/tmp/catch-up-$mode-$rep" > "$OUT/$mode-$rep.json" 2> "$OUT/$mode-$rep.err" \
      || echo "$mode $rep failed: $(tail -3 "$OUT/$mode-$rep.err")"
    rm -rf "/tmp/catch-up-$mode-$rep"
    echo "$mode $rep: $(tr -d '\n ' < "$OUT/$mode-$rep.json")"
  done
done
