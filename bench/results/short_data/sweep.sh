#!/usr/bin/env bash
# Runs build/bench/regret over orders s1..s5 and the given seeds, appending
# "tag,dataset,order,seed,final_loss" to runs.csv next to this script.
#   sweep.sh TAG "REGRET FLAGS" "DATASETS" "SEEDS"
#   sweep.sh paper "--bootstrap --c3=2" "digits vowel glass" "1 2 3"
# BIN=PATH runs another regret binary (the prototypes of prototypes.patch).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
tag=$1 flags=$2 datasets=${3:-"digits vowel glass"} seeds=${4:-"1 2 3"}
for ds in $datasets; do for s in 1 2 3 4 5; do for seed in $seeds; do
  # shellcheck disable=SC2086
  loss=$(${BIN:-build/bench/regret} --data="bench/data/$ds.csv" \
         --order="bench/data/orders/$ds.s$s.perm.txt" --train_threads=1 --report_every=0 \
         --seed="$seed" $flags | awk '/^final progressive loss/ {print $4}')
  echo "$tag,$ds,$s,$seed,$loss" >> "$here/runs.csv"
done; done; done
