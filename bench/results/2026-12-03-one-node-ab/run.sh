#!/bin/bash
# A/B: the build of 1be4814 (before) against the build of main (after), alternated.
set -u
OUT=$1
mkdir -p $OUT
for r in 1 2 3; do
  for v in before after; do
    for c in 1 1000; do
      rm -rf /tmp/ab-data-$v
      /tmp/ab-bin/$v/chorus bench --local /tmp/ab-data-$v --path embedded --clients $c --size 512 \
        --warmup 2 --duration 5 --commit-mode piggyback -o json --json $OUT/ordered-$v-c$c-r$r.json > /dev/null 2>>$OUT/stderr.txt
      echo "$v c=$c r=$r: $(python3 -c "import json;d=json.load(open('$OUT/ordered-$v-c$c-r$r.json'));print(round(d.get('appends_per_sec',d.get('throughput',0))))" 2>/dev/null)"
    done
    /tmp/ab-bin/$v/chorus-bench ooo --parts block,ycsb-clients --depths 32 --clients 16 \
      --block-systems ordered,parallel --ycsb-systems dependent --repeats 1 --seconds 3 --warmup 1 \
      --out $OUT/ooo-$v-r$r > $OUT/ooo-$v-r$r.log 2>&1
    grep -E "ops/s" $OUT/ooo-$v-r$r.log | sed "s/^/$v r=$r /" | cut -c1-120
  done
done
