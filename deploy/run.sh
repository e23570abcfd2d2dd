#!/usr/bin/env bash
# The main job: installs what is needed, builds, and runs batched D-UCB over the letter data
# set (20000 rounds, order s1) with XGBoost experts trained from the log, printing the
# progressive loss. Extra arguments go to the regret binary (see `build/bench/regret --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/build.sh
exec build/bench/regret --data=bench/data/letter.csv \
  --order=bench/data/orders/letter.s1.perm.txt "$@"
