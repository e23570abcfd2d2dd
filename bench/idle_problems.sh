#!/usr/bin/env bash
# What idle problems cost: decisiond pinned to CPU 0 with N empty problems (created through
# decisionctl), then its CPU over 10 s of idleness and the size and scrape time of /metrics.
#
# Usage: bench/idle_problems.sh [N (2000)] [DECISIOND (build/server/decisiond)]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/wait_for_decisiond.sh
n=${1:-2000}
bin=${2:-build/server/decisiond}
dir=$(mktemp -d)
taskset -c 0 "$bin" --data_dir="$dir" --listen=127.0.0.1:50081 \
  --metrics_listen=127.0.0.1:9481 2>"$dir.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir" "$dir.log"' EXIT
C="taskset -c 1 build/client/decisionctl --server=127.0.0.1:50081"
# shellcheck disable=SC2086  # $C: a command and its flags, split on purpose
wait_for_decisiond $pid "$dir.log" $C health
seq 1 "$n" | sed 's/^/p/' | xargs -P 4 -I{} $C create-problem {} --arms=4 --features=3 >/dev/null
sleep 3
hz=$(getconf CLK_TCK)
t0=$(awk '{print $14 + $15}' /proc/$pid/stat)
sleep 10
t1=$(awk '{print $14 + $15}' /proc/$pid/stat)
echo "problems $n: idle CPU $(echo "scale=1; 100 * ($t1 - $t0) / $hz / 10" | bc) % of a core"
start=$(date +%s.%N)
curl -s 127.0.0.1:9481/metrics > "$dir.metrics"
end=$(date +%s.%N)
echo "/metrics: $(wc -c < "$dir.metrics") bytes, $(grep -vc '^#' "$dir.metrics") series," \
  "scraped in $(echo "$end - $start" | bc) s"
rm -f "$dir.metrics"
