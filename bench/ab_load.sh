#!/usr/bin/env bash
# Alternating A/B runs of bench/load for two decisiond builds, pinned as DEVELOPERS.md asks:
# the servers (decisiond and its null server) on CPU 0, the load client on CPU 1.
#
# Usage: bench/ab_load.sh A_DECISIOND B_DECISIOND [PAIRS] [extra bench/load flags...]
#   e.g. bench/ab_load.sh /tmp/base/build/server/decisiond build/server/decisiond 6
# Prints one line per run (A, B, A, B, ...) with bench/load's decisiond line and its ratios
# to the null server of the same run, then the median of each column per build.
set -euo pipefail
cd "$(dirname "$0")/.."
a=$(realpath "$1") b=$(realpath "$2") pairs=${3:-6}
shift $(($# < 3 ? $# : 3))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# bench/load starts the servers itself: wrappers pin them (exec keeps the pid, so bench/load
# still reads the server's CPU time from /proc).
pin() { printf '#!/bin/sh\nexec taskset -c 0 %s "$@"\n' "$1" > "$2"; }
pin "$a" "$work/decisiond_a"
pin "$b" "$work/decisiond_b"
pin "$(realpath build/bench/null_server)" "$work/null"
chmod +x "$work"/*
for ((i = 1; i <= pairs; ++i)); do
  for name in a b; do
    line=$(taskset -c 1 build/bench/load --concurrency=8 --duration_s=8 --warmup_s=2 \
             --decisiond="$work/decisiond_$name" --null_server="$work/null" "$@" 2>&1 |
           grep -E '^decisiond |^ +8 ' | tr -s ' \n' ' ')
    echo "$i $name $line" | tee -a "$work/runs"
  done
done
python3 - "$work/runs" <<'EOF'
import re, statistics, sys
pat = re.compile(r'(\S+) rpc/s Choose p50/p99/p999 (\S+) (\S+) (\S+) us Reward p50/p99/p999 '
                 r'(\S+) (\S+) (\S+) us CPU/rpc server (\S+) client (\S+) us errors \d+ 8 '
                 r'(\S+) (\S+) (\S+) (\S+)')
names = ['rpc/s', 'Choose p50 us', 'Choose p99 us', 'Choose p999 us', 'Reward p50 us',
         'Reward p99 us', 'Reward p999 us', 'server CPU/rpc us', 'client CPU/rpc us',
         'throughput / null', 'Choose p99 / null', 'Reward p99 / null', 'server CPU / null']
runs = {'a': [], 'b': []}
for line in open(sys.argv[1]):
    m = pat.search(line)
    if m:
        runs[line.split()[1]].append([float(x) for x in m.groups()])
print(f"{'median over runs':22s} {'A':>10s} {'B':>10s} {'B/A':>6s}")
for i, name in enumerate(names):
    a = statistics.median(r[i] for r in runs['a'])
    b = statistics.median(r[i] for r in runs['b'])
    print(f"{name:22s} {a:10.2f} {b:10.2f} {b / a:6.2f}")
EOF
