#!/usr/bin/env bash
# Makes tree experts trained on letter by the service itself, for `load --experts_from=DIR`:
# starts a decisiond on a fresh data directory, creates a problem with letter's 26 arms and
# 16 features, replays the first ROUNDS rows of letter (order s1) with `decisionctl replay`
# so that the problem has a log (the uniform expert: about 1 reward in 26), has the service
# train tree experts on it with `decisionctl train --tree_experts=N --linear_experts=0 --wait`
# (at most 16 per job) until there are EXPERTS of them, stops decisiond and writes their
# models to OUT_DIR with build/bench/export_models (no RPC returns model bytes). The trainer
# draws each expert's depth (3, 6 or 10) and rounds (10, 20 or 40) as auto-training does
# (core/xgboost_trainer.cc, SampleExpertOptions); export_models prints each model's shape.
#
# Usage: bench/make_tree_experts.sh OUT_DIR [ROUNDS (10000)] [EXPERTS (32)]
#   then: build/bench/load --experts_from=OUT_DIR --contexts=bench/data/letter.csv
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/make_tree_experts.sh OUT_DIR [ROUNDS] [EXPERTS]}
rounds=${2:-10000} experts=${3:-32}
if [[ -e "$out" && -n "$(ls -A "$out")" ]]; then
  echo "make_tree_experts: $out is not empty" >&2
  exit 2
fi
work=$(mktemp -d)
build/server/decisiond --data_dir="$work/data" --listen=127.0.0.1:0 --metrics_listen= \
  --seed=1 >"$work/stdout" 2>"$work/stderr" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$work"' EXIT
# "decisiond listening on HOST:PORT metrics on ...": the port is the OS's choice.
for _ in $(seq 300); do
  grep -q listening "$work/stdout" && break
  kill -0 $pid 2>/dev/null || { cat "$work/stderr" >&2; exit 1; }
  sleep 0.1
done
address=$(awk '/listening/ {print $4}' "$work/stdout")
C="build/client/decisionctl --server=$address"
$C create-problem letter --arms=26 --features=16
start=$(date +%s.%N)
$C replay letter --data=bench/data/letter.csv --order=bench/data/orders/letter.s1.perm.txt \
  --rounds="$rounds" | tail -1
echo "replayed $rounds rounds in $(echo "$(date +%s.%N) - $start" | bc) s"
trees() { $C list-experts letter | grep -c -- '-trees-' || true; }
for attempt in $(seq 10); do
  have=$(trees)
  ((have >= experts)) && break
  want=$((experts - have > 16 ? 16 : experts - have))
  start=$(date +%s.%N)
  $C train letter --tree_experts="$want" --linear_experts=0 --wait | tail -1
  echo "trained in $(echo "$(date +%s.%N) - $start" | bc) s"
done
have=$(trees)
if ((have != experts)); then
  echo "make_tree_experts: $have tree experts, wanted $experts" >&2
  exit 1
fi
# RocksDB admits one process per data directory: export once decisiond has stopped.
kill -TERM $pid
wait $pid
build/bench/export_models --data_dir="$work/data" --problem=letter --out="$out" \
  --name_contains=-trees-
