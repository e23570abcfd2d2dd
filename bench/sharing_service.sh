#!/usr/bin/env bash
# sharing_service.sh: the fixed-pool experiment of bench/sharing_suite.sh through a running
# decisiond (default flags), to check that the service reproduces the simulation. For one
# pool size and order: bench/regret trains the pool on the first 2000 rows of the order and
# saves its models (--save_pool); a fresh decisiond gets the same experts, registered in
# the same order (expert ids 1..N, the uniform expert 0 besides, no auto-training), and
# `decisionctl replay` plays the other 18000 rows of the order through it.
#
# Usage: bench/sharing_service.sh N ORDER [OUT_DIR]   e.g. bench/sharing_service.sh 200 1
# Prints the simulation's final loss and the service's, and appends a row
# "experts,order,simulation_loss,service_loss,replay_seconds" to OUT_DIR/service.csv
# (default bench/results/sharing).
set -euo pipefail
{
cd "$(dirname "${BASH_SOURCE[0]}")/.."
n=${1:?usage: sharing_service.sh N ORDER [OUT_DIR]}
order=${2:?usage: sharing_service.sh N ORDER [OUT_DIR]}
out=${3:-bench/results/sharing}
work=$(mktemp -d "${TMPDIR:-/tmp}/sharing_service.XXXXXX")
pid=""
trap '[[ -n "$pid" ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$out" "$work/pool"
perm=bench/data/orders/letter.s$order.perm.txt

sim=$(build/bench/regret --data=bench/data/letter.csv --order="$perm" --pool_experts="$n" \
        --pool_good=2 --pool_prefix=2000 --train_threads=1 --report_every=0 \
        --save_pool="$work/pool" | awk '/^final progressive loss/ {print $4}')

build/server/decisiond --listen=127.0.0.1:0 --metrics_listen= --data_dir="$work/data" \
  >"$work/decisiond.out" 2>"$work/decisiond.err" &
pid=$!
for _ in $(seq 1 100); do
  grep -q '^decisiond listening on ' "$work/decisiond.out" 2>/dev/null && break
  sleep 0.1
done
address=$(awk '/^decisiond listening on / {print $4}' "$work/decisiond.out")
C=(build/client/decisionctl --server="$address" --deadline_ms=60000)
"${C[@]}" create-problem pool --arms=26 --features=16 >/dev/null
for model in "$work"/pool/pool-*.ubj; do
  "${C[@]}" register-expert pool --name="$(basename "$model" .ubj)" --xgboost="$model" >/dev/null
done
until [[ $("${C[@]}" list-experts pool | grep -ciw active) -eq $((n + 1)) ]]; do sleep 0.2; done
tail -n +2001 "$perm" >"$work/order.txt"
start=$(date +%s.%N)
service=$("${C[@]}" replay pool --data=bench/data/letter.csv --order="$work/order.txt" |
            awk '/progressive loss/ {loss = $5} END {print loss}')
seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
echo "pool of $n, letter s$order: simulation $sim, decisiond $service (replay ${seconds} s)"
[[ -s "$out/service.csv" ]] || echo "experts,order,simulation_loss,service_loss,replay_seconds" >"$out/service.csv"
echo "$n,$order,$sim,$service,$seconds" >>"$out/service.csv"
exit 0
}
