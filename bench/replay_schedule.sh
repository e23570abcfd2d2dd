#!/usr/bin/env bash
# The README walkthrough, measured: decisiond with its default flags pinned to CPU 0,
# `decisionctl replay` of a labelled data set pinned to CPU 1 (letter s1 by default), then
# how long after the replay the batch schedule catches up (decision_batch_lag_rounds = 0).
#
# Usage: bench/replay_schedule.sh [DATA_CSV ORDER_FILE ARMS FEATURES]
# REPLAY_FLAGS adds decisionctl replay flags, e.g. REPLAY_FLAGS=--keep_schedule (wait at each
# batch boundary until its training is done: the paper's schedule, as if training kept up).
# CREATE_FLAGS adds decisionctl create-problem flags, e.g. CREATE_FLAGS=--divergence_refresh_turnover=0
# (re-estimate the divergences at every boundary). DECISIOND=PATH and DECISIONCTL=PATH run
# other decisiond and decisionctl binaries (A/B runs); DECISIOND_FLAGS adds decisiond flags
# (e.g. --seed=7); CLIENT_CPU moves the replay off CPU 1 (e.g. CLIENT_CPU=0 while CPU 1 runs
# something else); SERVER_CPUS moves decisiond off CPU 0 (a taskset list: SERVER_CPUS=0,1
# CLIENT_CPU=0,1 runs both unpinned on a 2-core machine). The script prints decisiond's CPU
# time, per thread too, and what the store wrote per record family.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/wait_for_decisiond.sh
data=${1:-bench/data/letter.csv} order=${2:-bench/data/orders/letter.s1.perm.txt}
arms=${3:-26} features=${4:-16}
dir=$(mktemp -d)
# shellcheck disable=SC2086
taskset -c "${SERVER_CPUS:-0}" "${DECISIOND:-build/server/decisiond}" --data_dir="$dir" --listen=127.0.0.1:50071 \
  --metrics_listen=127.0.0.1:9471 ${DECISIOND_FLAGS:-} 2>"$dir.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
C="taskset -c ${CLIENT_CPU:-1} ${DECISIONCTL:-build/client/decisionctl} --server=127.0.0.1:50071"
# shellcheck disable=SC2086  # $C: a command and its flags, split on purpose
wait_for_decisiond $pid "$dir.log" $C health
$C create-problem p --arms="$arms" --features="$features" --auto_train ${CREATE_FLAGS:-} >/dev/null
start=$(date +%s.%N)
$C replay p --data="$data" --order="$order" ${REPLAY_FLAGS:-} | tail -1
end=$(date +%s.%N)
lag() { curl -s 127.0.0.1:9471/metrics | awk '/^decision_batch_lag_rounds/ {print $2}'; }
echo "replay: $(echo "$end - $start" | bc) s; rounds behind the schedule at its end: $(lag)"
while [[ "$(lag)" != "0" ]]; do sleep 1; done
echo "schedule caught up $(echo "$(date +%s.%N) - $end" | bc) s later;" \
     "$($C jobs p | grep -c SUCCEEDED) training jobs succeeded, $($C list-experts p | tail -n +2 | wc -l) experts"
awk -v hz="$(getconf CLK_TCK)" '{printf "decisiond CPU: %.1f s user, %.1f s system\n", $14 / hz, $15 / hz}' /proc/$pid/stat
# Per thread (name: user + system seconds; threads of one name added up). A store merge
# runs on the thread that started the store's compactor (maintenance's).
for t in /proc/$pid/task/*; do cat "$t/stat"; done | awk -v hz="$(getconf CLK_TCK)" '
  { match($0, /\(.*\)/); name = substr($0, RSTART + 1, RLENGTH - 2)
    split(substr($0, RSTART + RLENGTH + 1), f, " "); cpu[name] += (f[12] + f[13]) / hz }
  END { for (n in cpu) if (cpu[n] >= 0.1) printf "  thread %-16s %5.1f s\n", n, cpu[n] }' |
  sort -k3 -n -r
# What RocksDB wrote per family: memtables flushed, and compactions (RocksDB's and the
# store's merges) with their output and CPU, from its LOG.
awk '
  match($0, /\[[a-z_]+\] \[JOB [0-9]+\]/) {
    split(substr($0, RSTART + 1, RLENGTH - 2), w, /[] []+/); cf[w[3]] = w[1] }
  /"event": "flush_started"/ { j = num("job"); flushed[cf[j]] += num("total_data_size") }
  /"event": "compaction_finished"/ { j = num("job"); n[cf[j]]++
    out[cf[j]] += num("total_output_size"); us[cf[j]] += num("compaction_time_cpu_micros") }
  function num(key,   m) { m = match($0, "\"" key "\": [0-9]+"); if (!m) return 0
    return substr($0, RSTART + length(key) + 4, RLENGTH - length(key) - 4) + 0 }
  END { for (f in flushed) if (flushed[f] + out[f] > 1e6)
    printf "  store %-13s %7.1f MB flushed, %3d compactions: %7.1f MB written, %.2f s CPU\n",
           f, flushed[f] / 1e6, n[f], out[f] / 1e6, us[f] / 1e6 }' "$dir/LOG" | sort
curl -s 127.0.0.1:9471/metrics | grep -E '^decision_(divergence_boundaries_total|problem_memory_bytes|checkpoints_total|checkpoint_bytes_total)' || true
