#!/usr/bin/env bash
# Same binary: serial sync (default) vs --pipelined-sync, alternating; then AppendStream over gRPC (grpc-stream).
OUT=${OUT:-bench/results/2026-12-06-pipelined-sync}; mkdir -p $OUT
bin=${CHORUS_BIN:-target/release/chorus}
run() { d=$(mktemp -d /tmp/abdata.XXXX); $bin bench --local $d --size 512 --warmup 2 --duration 5 --commit-mode piggyback -o json --json "$@" > /dev/null 2>>$OUT/err; echo "$* rc=$?"; rm -rf $d; }
for rep in 1 2 3; do
  for c in 1000 1; do
    run $OUT/serial-$c-$rep.json --path embedded --clients $c
    run $OUT/pipe-$c-$rep.json --path embedded --clients $c --pipelined-sync
  done
  run $OUT/stream-1000-$rep.json --path grpc-stream --clients 1000
  run $OUT/stream-1-$rep.json --path grpc-stream --clients 1
done
