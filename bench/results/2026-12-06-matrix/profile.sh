#!/usr/bin/env bash
# Where the time goes at 512 B and 1,000 embedded clients: a whole-machine on-CPU profile
# (perf record -a -g at 499 Hz, 10 s in the middle of a 24 s run) of the serial
# sync path (the default) and of --pipelined-sync, with the machine's busy and idle
# shares from /proc/stat over the same 10 s. Writes profile-<variant>.txt.
set -euo pipefail
OUT=${OUT:-bench/results/2026-12-06-matrix}
bin=${CHORUS_BIN:-target/release/chorus}
cpu() { awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat; }
for variant in ${VARIANTS:-serial pipelined}; do
  extra=()
  [[ $variant == pipelined ]] && extra=(--pipelined-sync)
  d=$(mktemp -d /tmp/prof.XXXX)
  $bin bench --local "$d" --path embedded --clients 1000 --size 512 --warmup 2 --duration 22 \
    -o json --json "$OUT/profile-$variant.json" "${extra[@]}" >/dev/null 2>&1 &
  pid=$!
  sleep 8
  read -r b0 i0 < <(cpu)
  perf record -a -g -F 499 -o "/tmp/perf-$variant.data" -- sleep 10 2>/dev/null
  read -r b1 i1 < <(cpu)
  wait $pid || true
  rm -rf "$d"
  {
    echo "# $variant: busy $(( (b1-b0)*100/((b1-b0)+(i1-i0)) ))% of both CPUs over the 10 s (/proc/stat: user+nice+system+irq+softirq vs idle+iowait)"
    echo "## by command and object"
    perf report -i "/tmp/perf-$variant.data" --no-children --sort comm,dso --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | grep '%' | head -25
    echo "## top symbols"
    perf report -i "/tmp/perf-$variant.data" --no-children --sort sym --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | grep '%' | head -40
  } > "$OUT/profile-$variant.txt"
  echo "$variant: $(head -1 "$OUT/profile-$variant.txt")"
done
