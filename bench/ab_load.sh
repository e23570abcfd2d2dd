#!/usr/bin/env bash
# Alternating A/B runs of bench/load for two decisiond builds, at concurrency 8. bench/load
# pins the servers (decisiond and its null server) to CPU 0 and itself to CPU 1 (its
# --server_cpus and --client_cpus).
#
# Usage: bench/ab_load.sh A_DECISIOND B_DECISIOND [PAIRS] [extra bench/load flags...]
#   e.g. bench/ab_load.sh /tmp/base/build/server/decisiond build/server/decisiond 6
# Prints one line per run (A, B, A, B, ...) with bench/load's null and decisiond lines, then
# the median of each column per build, with the ratios to the null server of the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
a=$(realpath "$1") b=$(realpath "$2") pairs=${3:-6}
shift $(($# < 3 ? $# : 3))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for ((i = 1; i <= pairs; ++i)); do
  for name in a b; do
    binary=$a
    [[ $name == b ]] && binary=$b
    line=$(build/bench/load --concurrency=8 --duration_s=8 --warmup_s=2 --decisiond="$binary" \
             "$@" 2>&1 | grep -E '^(null|decisiond) +c=8 ' | tr -s ' \n' ' ')
    echo "$i $name $line" | tee -a "$work/runs"
  done
done
python3 - "$work/runs" <<'PY'
import re, statistics, sys
run = (r'(\S+) rpc/s Choose p50/p99/p999 (\S+) (\S+) (\S+) us Reward p50/p99/p999 '
       r'(\S+) (\S+) (\S+) us CPU/rpc server (\S+) client (\S+) us errors \d+')
pat = re.compile(r'null c=8 ' + run + r' decisiond c=8 ' + run)
names = ['rpc/s', 'Choose p50 us', 'Choose p99 us', 'Choose p999 us', 'Reward p50 us',
         'Reward p99 us', 'Reward p999 us', 'server CPU/rpc us', 'client CPU/rpc us',
         'throughput / null', 'Choose p99 / null', 'Reward p99 / null', 'server CPU / null',
         'server CPU/pair - null us']
runs = {'a': [], 'b': []}
for line in open(sys.argv[1]):
    m = pat.search(line)
    if m:
        v = [float(x) for x in m.groups()]
        null, real = v[:9], v[9:]
        runs[line.split()[1]].append(real + [real[0] / null[0], real[2] / null[2],
                                             real[5] / null[5], real[7] / null[7],
                                             2 * (real[7] - null[7])])
print(f"{'median over runs':26s} {'A':>10s} {'B':>10s} {'B/A':>6s}")
for i, name in enumerate(names):
    a = statistics.median(r[i] for r in runs['a'])
    b = statistics.median(r[i] for r in runs['b'])
    print(f"{name:26s} {a:10.2f} {b:10.2f} {b / a:6.2f}")
PY
