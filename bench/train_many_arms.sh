#!/usr/bin/env bash
# One training job on a problem with many arms or many features: what it costs decisiond in
# time and memory, and whether its experts register. A problem of ARMS arms and FEATURES
# features is fed SAMPLES rewarded decisions (`decisionctl replay` of a generated labelled
# CSV, label = an arm from the first feature), then `decisionctl train --tree_experts=4
# --linear_experts=0 --wait` runs one job. Prints the job's line, its wall time,
# decisiond's peak RSS (sampled every 0.2 s) and decisiond's CPU time.
#
# Usage: bench/train_many_arms.sh [ARMS SAMPLES FEATURES]      (default 2048 12000 4)
# DECISIOND=PATH runs another decisiond (A/B runs: copy it with decision_model_probe, which
# it looks for beside itself); SEED is decisiond's --seed (default 1: the same recipes).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/wait_for_decisiond.sh
arms=${1:-2048} samples=${2:-12000} features=${3:-4}
dir=$(mktemp -d)
awk -v n="$samples" -v k="$arms" -v d="$features" 'BEGIN {
  srand(1);
  for (f = 0; f < d; f++) printf "x%d,", f;
  print "label";
  for (i = 0; i < n; i++) {
    a = rand(); printf "%.4f,", a;
    for (f = 1; f < d; f++) printf "%.4f,", rand();
    printf "%d\n", int(a * k) % k;
  } }' > "$dir/data.csv"
"${DECISIOND:-build/server/decisiond}" --seed="${SEED:-1}" --data_dir="$dir/store" \
  --listen=127.0.0.1:50072 --metrics_listen= >"$dir/decisiond.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
C="build/client/decisionctl --server=127.0.0.1:50072"
# shellcheck disable=SC2086  # $C: a command and its flags, split on purpose
wait_for_decisiond $pid "$dir/decisiond.log" $C health
$C create-problem big --arms="$arms" --features="$features" >/dev/null
$C replay big --data="$dir/data.csv" >/dev/null
(while kill -0 $pid 2>/dev/null; do
  awk '/VmRSS/ {print $2}' /proc/$pid/status 2>/dev/null || true
  sleep 0.2
done) > "$dir/rss.txt" &
start=$(date +%s.%N)
# A FAILED job makes decisionctl exit 1: the figures are printed all the same.
$C train big --tree_experts=4 --linear_experts=0 --wait | tail -1 | cut -c1-300 || true
end=$(date +%s.%N)
cpu=$(awk '{printf "%.1f", ($14 + $15) / 100}' /proc/$pid/stat)
peak=$(sort -n "$dir/rss.txt" | tail -1)
echo "arms $arms, features $features, samples $samples: job $(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}') s, decisiond peak RSS $((peak / 1024)) MiB, CPU $cpu s"
