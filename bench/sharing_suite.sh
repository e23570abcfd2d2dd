#!/usr/bin/env bash
# sharing_suite.sh: where sharing information between experts pays (issue 17). Runs
# build/bench/regret on letter with a fixed pool of experts (regret --pool_experts: trained
# with full information on a held-back prefix of 2000 rows, 2 good and the rest weak), for
# each policy and order, two experiments:
#   pool   pools of 20, 50, 100 and 200 experts: the regret against the pool's best expert
#          over the 18000 rounds played. D-UCB's should grow with the divergences between
#          experts, not with their number; UCB1 and epsilon-greedy treat them as separate
#          arms, EXP4 mixes them.
#   late   a pool of 50, and a stronger expert added at round 3000 (regret
#          --late_expert_round), as a team registers a new model: the rounds until 90% of a
#          window of 100 decisions follow it, and the regret after round 3000 against it.
#
# Usage: bench/sharing_suite.sh [--orders=1,2,3,4,5] [--jobs=2] [--out=bench/results/sharing]
#            [--bin=build/bench/regret] [--experiments="pool late"] [--sizes=20,50,100,200]
#        bench/sharing_suite.sh --summarize-only [--out=DIR]   (the tables again, from the logs)
# Writes into OUT: logs/*.log (each run's output), pool.csv, late.csv (one row per run),
# summary.md (the tables: mean ± std over the orders) and pool.png (regret against the
# number of experts, per policy). About 15 minutes on 2 cores.
set -euo pipefail
{
self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$self")/.."

orders="1 2 3 4 5"
jobs=2
out="bench/results/sharing"
bin="build/bench/regret"
experiments="pool late"
summarize_only=0
policies="d-ucb ucb1 epsilon-greedy exp4"
sizes="20 50 100 200"
for arg in "$@"; do
  case "$arg" in
    --orders=*) orders="${arg#*=}"; orders="${orders//,/ }"; orders="${orders//s/}" ;;
    --jobs=*) jobs="${arg#*=}" ;;
    --out=*) out="${arg#*=}" ;;
    --bin=*) bin="${arg#*=}" ;;
    --experiments=*) experiments="${arg#*=}" ;;
    --sizes=*) sizes="${arg#*=}"; sizes="${sizes//,/ }" ;;
    --summarize-only) summarize_only=1 ;;
    *) echo "sharing_suite: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[[ -x "$bin" ]] || { echo "sharing_suite: $bin is not built (cmake --build build --target regret)" >&2; exit 1; }
mkdir -p "$out/logs"

# One run: EXPERIMENT POLICY N ORDER -> its log.
run() {
  local experiment=$1 policy=$2 n=$3 order=$4
  local log="$out/logs/$experiment.$policy.n$n.s$order.log"
  local extra=()
  [[ "$experiment" == late ]] && extra=(--late_expert_round=3000)
  "$bin" --data=bench/data/letter.csv --order="bench/data/orders/letter.s$order.perm.txt" \
    --policy="$policy" --pool_experts="$n" --pool_good=2 --pool_prefix=2000 \
    --train_threads=1 --report_every=0 "${extra[@]}" >"$log" 2>&1 ||
    { echo "sharing_suite: run failed: $log" >&2; return 1; }
}
export -f run
export out bin

jobs_list=()
for experiment in $experiments; do
  for policy in $policies; do
    for order in $orders; do
      if [[ "$experiment" == pool ]]; then
        for n in $sizes; do jobs_list+=("$experiment $policy $n $order"); done
      else
        jobs_list+=("$experiment $policy 50 $order")
      fi
    done
  done
done
if ((summarize_only == 0)); then
  start=$SECONDS
  printf '%s\n' "${jobs_list[@]}" | xargs -P "$jobs" -L 1 bash -c 'run "$@"' _
  echo "sharing_suite: ${#jobs_list[@]} runs in $((SECONDS - start)) s"
fi

# The tables.
echo "policy,experts,order,final_loss,best_true_mean,regret,seconds" >"$out/pool.csv"
echo "policy,order,final_loss,rounds_to_90,regret_after,late_true_mean" >"$out/late.csv"
for log in "$out"/logs/pool.*.log; do
  [[ -e "$log" ]] || continue
  name=$(basename "$log" .log)  # pool.POLICY.nN.sS
  IFS=. read -r _ policy n order <<<"$name"
  awk -v p="$policy" -v n="${n#n}" -v o="${order#s}" '
    /^final progressive loss/ { loss = $4; secs = $10 }
    /^pool: best_true_mean/ { best = $3; regret = $5 }
    END { printf "%s,%s,%s,%s,%s,%s,%s\n", p, n, o, loss, best, regret, secs }' "$log" >>"$out/pool.csv"
done
for log in "$out"/logs/late.*.log; do
  [[ -e "$log" ]] || continue
  name=$(basename "$log" .log)
  IFS=. read -r _ policy _ order <<<"$name"
  awk -v p="$policy" -v o="${order#s}" '
    /^final progressive loss/ { loss = $4 }
    /^late expert:/ { r90 = $4; regret = $6; mean = $8 }
    END { printf "%s,%s,%s,%s,%s,%s\n", p, o, loss, r90, regret, mean }' "$log" >>"$out/late.csv"
done

# The table of pool.csv's column COLUMN (mean ± std over the orders, as FORMAT), one row per
# policy and one column per pool size.
pool_table() {
  local column=$1 format=$2 policy n
  printf '| policy |'; for n in $sizes; do printf ' %s experts |' "$n"; done; echo
  printf '|---|'; for n in $sizes; do printf -- '---|'; done; echo
  for policy in $policies; do
    printf '| %s |' "$policy"
    for n in $sizes; do
      awk -F, -v p="$policy" -v n="$n" -v c="$column" -v f=" $format |" '
        NR > 1 && $1 == p && $2 == n { s += $c; q += $c * $c; k++ }
        END { if (k) { m = s / k; v = k > 1 ? (q - k * m * m) / (k - 1) : 0; if (v < 0) v = 0;
              printf f, m, sqrt(v) } else printf " - |" }' "$out/pool.csv"
    done
    echo
  done
}

{
  echo "# Where sharing information between experts pays (letter, fixed pools)"
  echo
  echo "Command: \`bench/sharing_suite.sh --orders=${orders// /,}\` ($(date -u +%Y-%m-%d))."
  echo "Pools trained with full information on the first 2000 rows of each order (2 good"
  echo "experts, the rest weak; the uniform expert besides), then 18000 rounds played."
  echo
  echo "## Regret against the pool's best expert (mean ± std over the orders)"
  echo
  pool_table 6 '%.0f ± %.0f'
  echo
  echo "Final progressive loss, same runs:"
  echo
  pool_table 4 '%.3f ± %.3f'
  echo
  echo "## A stronger expert added at round 3000 (pool of 50)"
  echo
  echo "| policy | rounds until 90% of 100 decisions follow it | regret after round 3000 against it | final loss |"
  echo "|---|---|---|---|"
  for policy in $policies; do
    awk -F, -v p="$policy" 'NR > 1 && $1 == p { c++; l += $3; g += $5; gq += $5 * $5;
        if ($4 >= 0) { r += $4; rc++ } else never++ }
      END { if (!c) exit; m = g / c; v = c > 1 ? (gq - c * m * m) / (c - 1) : 0; if (v < 0) v = 0;
        printf "| %s | %s | %.0f ± %.0f | %.3f |\n", p,
          rc ? sprintf("%.0f (%d of %d runs)", r / rc, rc, c) : sprintf("never (%d runs)", c),
          m, sqrt(v), l / c }' "$out/late.csv"
  done
} >"$out/summary.md"

if command -v gnuplot >/dev/null && [[ -s "$out/pool.csv" ]]; then
  for policy in $policies; do
    for n in $sizes; do
      awk -F, -v p="$policy" -v n="$n" 'NR > 1 && $1 == p && $2 == n { s += $6; c++ }
        END { if (c) printf "%s %.1f\n", n, s / c }' "$out/pool.csv"
    done >"$out/pool.$policy.dat"
  done
  gnuplot <<GP
set terminal pngcairo size 900,560
set output "$out/pool.png"
set title "letter: regret against the pool's best expert, 18000 rounds (mean over orders)"
set xlabel "experts in the pool"
set ylabel "regret"
set logscale x 2
set key left top
set grid
plot $(first=1; for policy in $policies; do
  [[ $first == 1 ]] || printf ', '
  first=0
  printf '"%s" using 1:2 with linespoints title "%s"' "$out/pool.$policy.dat" "$policy"
done)
GP
  rm -f "$out"/pool.*.dat
fi
echo "sharing_suite: wrote $out/summary.md"
exit 0
}
