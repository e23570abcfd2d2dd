#!/usr/bin/env bash
# The paper experiment through the service, next to the simulation (issue 17): replays a
# labelled data set through a decisiond started with its default flags (auto-training on,
# `decisionctl replay --keep_schedule`: the paper's batched schedule, as if training kept
# up), runs bench/regret on the same order (one training thread), and plots both
# progressive-loss curves. decisiond and the replay share every CPU of the machine (set
# SERVER_CPUS and CLIENT_CPU, taskset lists, to pin them as bench/replay_schedule.sh does).
#
# Usage: bench/paper_experiment.sh OUT_DIR [ORDER [DATA_CSV ARMS FEATURES]]
#   bench/paper_experiment.sh /tmp/paper            # letter s1, 2 to 4 minutes
#   bench/paper_experiment.sh /tmp/paper 3          # letter s3
#   bench/paper_experiment.sh /tmp/paper 1 bench/data/digits.csv 10 64
# Writes OUT_DIR/{service,simulation}.NAME.sS.csv, OUT_DIR/NAME.sS.png (gnuplot) and prints
# both final losses. Needs build/server/decisiond, build/client/decisionctl and
# build/bench/regret (cmake --build build -j2).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/paper_experiment.sh OUT_DIR [ORDER [DATA_CSV ARMS FEATURES]]}
order=${2:-1}
data=${3:-bench/data/letter.csv} arms=${4:-26} features=${5:-16}
name=$(basename "$data" .csv)
order_file=bench/data/orders/$name.s$order.perm.txt
mkdir -p "$out"
out=$(cd "$out" && pwd)
service_csv=$out/service.$name.s$order.csv
sim_csv=$out/simulation.$name.s$order.csv

echo "== service: decisiond (default flags), decisionctl replay --keep_schedule"
all_cpus=0-$(($(nproc) - 1))
SERVER_CPUS=${SERVER_CPUS:-$all_cpus} CLIENT_CPU=${CLIENT_CPU:-$all_cpus} \
  REPLAY_FLAGS="--keep_schedule --curve_csv=$service_csv" \
  bench/replay_schedule.sh "$data" "$order_file" "$arms" "$features" 2>/dev/null |
  grep -E "progressive loss|^replay:|training jobs"
echo "== simulation: bench/regret --train_threads=1"
build/bench/regret --data="$data" --order="$order_file" --train_threads=1 --report_every=0 \
  --curve_csv="$sim_csv" | grep "final progressive loss"

if ! command -v gnuplot > /dev/null; then
  echo "paper_experiment: gnuplot not found, no plot (sudo apt-get install -y gnuplot-nox)" >&2
  exit 0
fi
gnuplot <<EOF
set terminal pngcairo size 1000,600 noenhanced font 'DejaVu Sans,11'
set output '$out/$name.s$order.png'
set datafile separator ','
set key top right
set title '$name s$order: decisiond (replay --keep_schedule) and bench/regret'
set xlabel 'round'
set ylabel 'progressive loss (1 - mean reward so far)'
set grid
set yrange [0:1.02]
plot '$service_csv' using 1:2 with lines lw 2 title 'decisiond, default flags', \
     '$sim_csv' using 1:2 with lines lw 2 dt 2 title 'bench/regret (simulation)'
EOF
echo "paper_experiment: wrote $out/$name.s$order.png"
