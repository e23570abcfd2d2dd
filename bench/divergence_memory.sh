#!/bin/bash
# divergence_memory.sh: decisiond's peak RSS and its expert-pool thread's CPU while
# bench/load drives a problem with many arms and experts, where the divergence
# computations (the expert-pool thread) hold the most: every expert's predictions on the
# reservoir's 2048 contexts are 2048 x K x 8 bytes.
#
#   bench/divergence_memory.sh [ARMS [EXPERTS [SECONDS]]]    # default 4096 33 40
#
# EXPERTS counts the uniform expert. DECISIOND=DIR/decisiond (DIR must also hold
# decision_model_probe) measures another build; LOAD=path the load generator
# (build/bench/load). --max_divergence_terms is raised so that the experts register
# (when the build has it).
# Prints one line: arms, experts, peak RSS (MiB), expert-pool CPU (s), and load's figures.
set -euo pipefail
arms="${1:-4096}"
experts="${2:-33}"
seconds="${3:-40}"
load="${LOAD:-build/bench/load}"
decisiond="${DECISIOND:-build/server/decisiond}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

flags=()
help="$("$decisiond" --help 2>&1 || true)"  # (--help exits 1)
if grep -q max_divergence_terms <<<"$help"; then  # builds before the cap: none
  flags=(--decisiond_flags=--max_divergence_terms=1000000000000)
fi
"$load" --decisiond="$decisiond" --arms="$arms" --experts="$experts" --concurrency=8 \
  --duration_s="$seconds" --warmup_s=2 "${flags[@]}" >"$log" 2>&1 &
load_pid=$!
peak_kb=0
pool_s=0
while kill -0 "$load_pid" 2>/dev/null; do
  pid="$(pgrep -n -x decisiond || true)"
  if [ -n "$pid" ] && [ -r "/proc/$pid/status" ]; then
    kb="$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)"
    [ "${kb:-0}" -gt "$peak_kb" ] && peak_kb="$kb"
    for task in /proc/"$pid"/task/*; do
      if [ "$(cat "$task/comm" 2>/dev/null)" = "expert-pool" ]; then
        pool_s="$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.1f", ($14 + $15) / hz}' \
          "$task/stat" 2>/dev/null || echo "$pool_s")"
      fi
    done
  fi
  sleep 1
done
wait "$load_pid" || { cat "$log" >&2; exit 1; }
echo "arms $arms experts $experts: decisiond peak RSS $((peak_kb / 1024)) MiB," \
  "expert-pool CPU ${pool_s} s; $(grep -E '^decisiond ' "$log" | tr -s ' ')"
