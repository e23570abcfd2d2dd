#!/usr/bin/env bash
# The time to move a problem between replicas (decisionctl move-problem): two decisiond on
# fresh data directories (both pinned to CPU 0, decisionctl to CPU 1), a problem of letter's
# shape (26 arms, 16 features) filled with SAMPLES rewarded decisions by parallel replays of
# bench/data/letter.csv, then the move with a placement command that does nothing (no
# proxy: the figure is the copy, the load on the target and the fence), twice: first
# without the catch-up (fenced for the whole copy), then back with it (the default: the
# copy at a snapshot while it serves, then fenced for what changed since). Prints each
# move's own report: records and bytes copied, and how long the problem was unavailable.
#
# Usage: bench/move_problem.sh [SAMPLES (100000, a multiple of 20000)] [DECISIOND] [DECISIONCTL]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/wait_for_decisiond.sh
samples=${1:-100000}
bin=${2:-build/server/decisiond}
ctl=${3:-build/client/decisionctl}
((samples % 20000 == 0)) || { echo "SAMPLES must be a multiple of 20000" >&2; exit 2; }
dir=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
for side in source target; do
  port=$([[ $side == source ]] && echo 50091 || echo 50092)
  taskset -c 0 "$bin" --data_dir="$dir/$side" --listen=127.0.0.1:$port --metrics_listen= \
    2>"$dir/$side.log" &
  pids+=($!)
done
C="taskset -c 1 $ctl --deadline_ms=20000"
# shellcheck disable=SC2086  # $C: a command and its flags, split on purpose
wait_for_decisiond "${pids[0]}" "$dir/source.log" $C --server=127.0.0.1:50091 health
# shellcheck disable=SC2086
wait_for_decisiond "${pids[1]}" "$dir/target.log" $C --server=127.0.0.1:50092 health
$C --server=127.0.0.1:50091 create-problem big --arms=26 --features=16 --wait_ms=600000 >/dev/null
start=$(date +%s)
seq 1 $((samples / 20000)) | xargs -P 4 -I{} \
  $C --server=127.0.0.1:50091 replay big --data=bench/data/letter.csv >/dev/null
echo "filled: $($C --server=127.0.0.1:50091 estimates big | head -n 1) in $(($(date +%s) - start)) s"
echo "source store: $(du -sh "$dir/source" | cut -f1)"
echo "-- stop and copy (--catch_up=false), source -> target:"
$C --server=127.0.0.1:50091 move-problem big --to=127.0.0.1:50092 --to_replica=target \
  --page_bytes=$((1 << 20)) --place_cmd=true --catch_up=false
echo "target: $($C --server=127.0.0.1:50092 estimates big | head -n 1)"
echo "-- with the catch-up (the default), target -> source (the import replaces its stub):"
$C --server=127.0.0.1:50092 move-problem big --to=127.0.0.1:50091 --to_replica=source \
  --page_bytes=$((1 << 20)) --place_cmd=true
echo "source: $($C --server=127.0.0.1:50091 estimates big | head -n 1)"
