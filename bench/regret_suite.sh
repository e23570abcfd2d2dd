#!/usr/bin/env bash
# regret_suite.sh: runs build/bench/regret over data sets x policies x orders, --jobs runs at
# a time, and summarises the final progressive losses against Vowpal Wabbit's best bandit
# result per data set (bench/data/README.md).
#
# Usage (from anywhere; the script works from the repository root):
#   bench/regret_suite.sh [--datasets=letter,satimage] [--orders=1,2,3] \
#       [--policies="d-ucb:median_of_means d-ucb:clipped ucb1 epsilon-greedy exp4 uniform"] \
#       [--out=bench/results] [--rounds=N] [--train_threads=1] [--seed=1] \
#       [--bin=build/bench/regret] [--eligible_share=0.5] [--regret_flags="--bootstrap --c3=2"] \
#       [--jobs=N]
#   bench/regret_suite.sh --summarize-only [--out=DIR] [--prune-curves]
#
# --jobs: runs at once (default: the CPUs / --train_threads). A run's result depends on its
# seed only (not on --train_threads, nor on what runs beside it); its time in runs.csv does.
# Policies are `NAME` or `NAME:ESTIMATOR` (the estimator only matters for d-ucb).
# --eligible_share passes per-round eligibility to every run (regret --eligible_share: that
# share of the arms eligible each round, the label always among them); VW's column in the
# summary is then not comparable (it chose among every arm).
# --regret_flags adds flags to every run (split at spaces), e.g. the paper's expert recipe
# (bench/results/paper_recipe).
# Writes into OUT:
#   curves/DATASET.POLICY.sS.csv  round,progressive_loss for every round (POLICY with ':'
#                                 replaced by '_')
#   logs/DATASET.POLICY.sS.log    the regret binary's output
#   runs.csv     dataset,policy,order,final_loss,experts,seconds,rounds; one row per run. A
#                re-run of the same (dataset, policy, order) replaces its row, so several
#                invocations with different --datasets/--policies accumulate.
#   summary.csv  per (dataset, policy): runs, mean and std of the final loss, mean seconds,
#                mean experts, VW's best bandit loss
#   summary.md   the loss table (mean ± std over the orders run) and the wall-time table
#   DATASET.png  progressive-loss curves of every policy on order s1 (or the first order
#                run), with VW's best bandit result as a dashed line
# The summary step (summary.*, PNGs) runs after every invocation over everything in
# runs.csv and curves/; --summarize-only runs just that step. --prune-curves deletes the
# curves of the orders that are not plotted and gzips the plotted ones (curves take about
# 15 bytes per round).
# The script stops at the first failing run.
set -euo pipefail

# The body is one { ... } group so that bash parses the whole file before running it: editing
# the script while a long suite runs does not affect the running copy.
{
self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$self")/.."

datasets="letter satimage shuttle digits vowel glass"
orders="1 2 3 4 5"
policies="d-ucb:median_of_means d-ucb:clipped ucb1 epsilon-greedy exp4 uniform"
out="bench/results"
rounds=""
train_threads=1
seed=""
bin="build/bench/regret"
eligible_share=""
regret_flags=""
summarize_only=0
prune_curves=0
jobs=""

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$self"; }
die() { echo "regret_suite: $*" >&2; exit 1; }

for arg in "$@"; do
  case "$arg" in
    --datasets=*) datasets="${arg#*=}"; datasets="${datasets//,/ }" ;;
    --orders=*) orders="${arg#*=}"; orders="${orders//,/ }"; orders="${orders//s/}" ;;
    --policies=*) policies="${arg#*=}"; policies="${policies//,/ }" ;;
    --out=*) out="${arg#*=}" ;;
    --rounds=*) rounds="${arg#*=}" ;;
    --train_threads=*) train_threads="${arg#*=}" ;;
    --seed=*) seed="${arg#*=}" ;;
    --bin=*) bin="${arg#*=}" ;;
    --eligible_share=*) eligible_share="${arg#*=}" ;;
    --regret_flags=*) regret_flags="${arg#*=}" ;;
    --jobs=*) jobs="${arg#*=}" ;;
    --summarize-only) summarize_only=1 ;;
    --prune-curves) prune_curves=1 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument \`$arg'" ;;
  esac
done
[[ -n "$out" ]] || die "--out must not be empty"
[[ "$train_threads" =~ ^[1-9][0-9]*$ ]] || die "--train_threads must be a positive integer"
# Runs at once: by default as many as the CPUs hold at --train_threads each. Each run is
# deterministic for a given seed, so this changes the wall time only.
if [[ -z "$jobs" ]]; then jobs=$(( $(nproc) / train_threads )); (( jobs >= 1 )) || jobs=1; fi
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive integer"

# VW 9.11.2's best one-pass bandit result per data set (bench/data/README.md).
vw_best() {
  case "$1" in
    letter) echo 0.790 ;; satimage) echo 0.504 ;; shuttle) echo 0.087 ;;
    digits) echo 0.405 ;; vowel) echo 0.828 ;; glass) echo 0.653 ;; *) echo "" ;;
  esac
}
# VW's full-information --oaa K (bench/data/README.md, the same orders): what a learner that
# sees every arm's reward reaches; no bandit result is expected to beat it.
vw_oaa() {
  case "$1" in
    letter) echo 0.468 ;; satimage) echo 0.337 ;; shuttle) echo 0.091 ;;
    digits) echo 0.106 ;; vowel) echo 0.701 ;; glass) echo 0.555 ;; *) echo "" ;;
  esac
}
# Canonical display orders; anything else goes after these, in order of appearance.
canon_datasets="letter satimage shuttle digits vowel glass"
canon_policies="d-ucb:median_of_means d-ucb:clipped ucb1 epsilon-greedy exp4 uniform"

runs_csv="$out/runs.csv"
runs_header="dataset,policy,order,final_loss,experts,seconds,rounds"

# ---------------------------------------------------------------------------- runs
# One run: its log, curve and row of runs.csv. Prints one line when it ends (runs in
# parallel print in the order they end). Exits non-zero if the run failed.
one_run() {
  local d=$1 p=$2 o=$3 n=$4 total=$5
  local name="${p%%:*}" est="median_of_means"
  [[ "$p" == *:* ]] && est="${p#*:}"
  local tag="${p//:/_}"
  local curve="$out/curves/$d.$tag.s$o.csv" log="$out/logs/$d.$tag.s$o.log"
  local args=(--data="bench/data/$d.csv" --order="bench/data/orders/$d.s$o.perm.txt"
              --policy="$name" --estimator="$est" --train_threads="$train_threads"
              --curve_csv="$curve" --report_every=0)
  [[ -n "$rounds" ]] && args+=(--rounds="$rounds")
  [[ -n "$seed" ]] && args+=(--seed="$seed")
  [[ -n "$eligible_share" ]] && args+=(--eligible_share="$eligible_share")
  # shellcheck disable=SC2206  # split at spaces on purpose
  [[ -n "$regret_flags" ]] && args+=($regret_flags)
  rm -f "$curve" "$curve.gz"
  local t0=$SECONDS status=0
  "$bin" "${args[@]}" > "$log" 2>&1 || status=$?
  local final
  final="$(grep '^final progressive loss' "$log" | tail -n1 || true)"
  if [[ $status -ne 0 || -z "$final" || ! -s "$curve" ]]; then
    echo "[$n/$total] $d $p s$o FAILED"
    echo "regret_suite: run failed: dataset $d, policy $p, order s$o (exit status $status)" >&2
    echo "regret_suite: command: $bin ${args[*]}" >&2
    echo "regret_suite: last lines of $log:" >&2
    tail -n 5 "$log" | sed 's/^/  /' >&2
    return 1
  fi
  # final progressive loss X after N rounds; E experts; T s (training A s, divergences B s)
  local row
  row="$(awk -v d="$d" -v p="$p" -v o="s$o" '{
      printf "%s,%s,%s,%s,%s,%s,%s\n", d, p, o, $4, $8, $10, $6 }' <<< "$final")"
  # Replace this run's row if it was run before, keep everything else; one writer at a
  # time (runs in parallel end at any moment).
  (
    flock 9
    awk -F, -v d="$d" -v p="$p" -v o="s$o" 'NR == 1 || !($1 == d && $2 == p && $3 == o)' \
      "$runs_csv" > "$runs_csv.tmp"
    echo "$row" >> "$runs_csv.tmp"
    mv "$runs_csv.tmp" "$runs_csv"
  ) 9> "$out/.runs.lock"
  echo "[$n/$total] $d $p s$o: loss $(cut -d, -f4 <<< "$row"), $(cut -d, -f5 <<< "$row") experts, $(cut -d, -f6 <<< "$row") s (wall $((SECONDS - t0)) s)"
}

run_all() {
  [[ -x "$bin" ]] || die "$bin is missing or not executable; build it with:
  cmake -S . -B build -G Ninja && ninja -C build regret"
  for d in $datasets; do
    [[ -f "bench/data/$d.csv" ]] || die "no data set bench/data/$d.csv"
    for o in $orders; do
      [[ -f "bench/data/orders/$d.s$o.perm.txt" ]] ||
        die "no order bench/data/orders/$d.s$o.perm.txt"
    done
  done
  mkdir -p "$out/curves" "$out/logs"
  if [[ ! -s "$runs_csv" ]]; then echo "$runs_header" > "$runs_csv"; fi
  head -n1 "$runs_csv" | grep -qx "$runs_header" ||
    die "$runs_csv has an unexpected header (expected $runs_header); move it away"

  local total=0 n=0 start_all=$SECONDS
  for d in $datasets; do for p in $policies; do for o in $orders; do total=$((total + 1)); done; done; done
  # Runs in flight are killed if one fails or the suite is interrupted.
  trap 'kill $(jobs -pr) 2>/dev/null || true' EXIT
  for d in $datasets; do
    for p in $policies; do
      for o in $orders; do
        n=$((n + 1))
        if [[ $jobs -le 1 ]]; then
          one_run "$d" "$p" "$o" "$n" "$total"
        else
          while [[ $(jobs -pr | wc -l) -ge $jobs ]]; do wait -n; done
          one_run "$d" "$p" "$o" "$n" "$total" &
        fi
      done
    done
  done
  while [[ $(jobs -pr | wc -l) -gt 0 ]]; do wait -n; done
  trap - EXIT
  echo "regret_suite: $n runs in $((SECONDS - start_all)) s"
}

# ------------------------------------------------------------------------- summary
summarize() {
  [[ -s "$runs_csv" ]] || die "no $runs_csv: run the suite first"
  local vw_list=""
  local oaa_list=""
  for d in $canon_datasets; do vw_list+="$d=$(vw_best "$d") "; done
  for d in $canon_datasets; do oaa_list+="$d=$(vw_oaa "$d") "; done

  awk -F, -v vw="$vw_list" -v oaa="$oaa_list" -v cd="$canon_datasets" -v cp="$canon_policies" \
      -v sum_csv="$out/summary.csv" -v sum_md="$out/summary.md" '
    function fmt_loss(key,   m, s) {
      if (!(key in cnt)) return "-"
      m = sum[key] / cnt[key]
      if (cnt[key] < 2) return sprintf("%.3f (%s only)", m, only[key])
      s = sqrt((sq[key] - cnt[key] * m * m) / (cnt[key] - 1))
      if (s < 0 || s != s) s = 0
      return sprintf("%.3f ± %.3f", m, s) (cnt[key] != maxn[ds_of[key]] ? sprintf(" (n=%d)", cnt[key]) : "")
    }
    function verdict(p, m, v) {
      if (p == "" || v == "") return "-"
      return sprintf("%s %.3f: %s", p, m, m < v + 0 ? "**beats**" : "loses")
    }
    BEGIN {
      nv = split(vw, a, " ")
      for (i = 1; i <= nv; i++) { split(a[i], b, "="); vwb[b[1]] = b[2] }
      no = split(oaa, a, " ")
      for (i = 1; i <= no; i++) { split(a[i], b, "="); vwo[b[1]] = b[2] }
      nd = split(cd, D, " "); for (i = 1; i <= nd; i++) dpos[D[i]] = i
      np = split(cp, P, " "); for (i = 1; i <= np; i++) ppos[P[i]] = i
    }
    NR == 1 { next }
    {
      d = $1; p = $2; key = d SUBSEP p
      if (!(d in dpos)) { D[++nd] = d; dpos[d] = nd }
      if (!(p in ppos)) { P[++np] = p; ppos[p] = np }
      if (!((d, p) in cnt)) only[key] = $3
      cnt[key]++; sum[key] += $4; sq[key] += $4 * $4
      secs[key] += $6; exps[key] += $5; ds_of[key] = d
      if (cnt[key] > maxn[d]) maxn[d] = cnt[key]
      seen_d[d] = 1; seen_p[p] = 1
      r = $7 + 0; if (!(d in rmin) || r < rmin[d]) rmin[d] = r; if (r > rmax[d]) rmax[d] = r
    }
    END {
      print "dataset,policy,runs,mean_loss,std_loss,mean_seconds,mean_experts,vw_best" > sum_csv
      for (i = 1; i <= nd; i++) {
        d = D[i]; if (!(d in seen_d)) continue
        for (j = 1; j <= np; j++) {
          p = P[j]; key = d SUBSEP p; if (!(key in cnt)) continue
          m = sum[key] / cnt[key]
          s = cnt[key] > 1 ? sqrt((sq[key] - cnt[key] * m * m) / (cnt[key] - 1)) : 0
          if (s != s) s = 0
          printf "%s,%s,%d,%.4f,%.4f,%.1f,%.1f,%s\n", d, p, cnt[key], m, s, secs[key] / cnt[key],
                 exps[key] / cnt[key], vwb[d] > sum_csv
        }
      }
      print "### Final progressive loss (mean ± std over the orders run; lower is better)\n" > sum_md
      hdr = "| data set |"; sep = "|---|"
      for (j = 1; j <= np; j++) if (P[j] in seen_p) { hdr = hdr " " P[j] " |"; sep = sep "---:|" }
      thdr = hdr; tsep = sep
      hdr = hdr " VW best bandit | VW --oaa (full information) |"
      hdr = hdr " best D-UCB vs VW | best policy vs VW |"
      sep = sep "---:|---:|---|---|"
      print hdr > sum_md; print sep > sum_md
      for (i = 1; i <= nd; i++) {
        d = D[i]; if (!(d in seen_d)) continue
        line = "| " d " |"; best = ""; bestm = 2; bestd = ""; bestdm = 2
        for (j = 1; j <= np; j++) {
          p = P[j]; if (!(p in seen_p)) continue
          key = d SUBSEP p
          line = line " " fmt_loss(key) " |"
          if (!(key in cnt)) continue
          m = sum[key] / cnt[key]
          if (p != "uniform" && m < bestm) { bestm = m; best = p }
          if (p ~ /^d-ucb/ && m < bestdm) { bestdm = m; bestd = p }
        }
        print line " " (vwb[d] != "" ? vwb[d] : "-") " | " (vwo[d] != "" ? vwo[d] : "-") " | " \
              verdict(bestd, bestdm, vwb[d]) " | " verdict(best, bestm, vwb[d]) " |" > sum_md
      }
      print "\nOrders: each cell averages the orders run for that data set (n is shown when a cell has fewer runs than its row).\n" > sum_md
      for (i = 1; i <= nd; i++) if ((D[i] in seen_d) && rmin[D[i]] != rmax[D[i]])
        printf "Warning: %s mixes runs of %d to %d rounds (--rounds).\n\n", D[i], rmin[D[i]], rmax[D[i]] > sum_md
      print "### Wall time (mean seconds per run, as reported by the binary)\n" > sum_md
      print thdr > sum_md; print tsep > sum_md
      for (i = 1; i <= nd; i++) {
        d = D[i]; if (!(d in seen_d)) continue
        line = "| " d " |"
        for (j = 1; j <= np; j++) {
          p = P[j]; if (!(p in seen_p)) continue
          key = d SUBSEP p
          line = line " " ((key in cnt) ? sprintf("%.1f", secs[key] / cnt[key]) : "-") " |"
        }
        print line > sum_md
      }
      total = 0; for (k in secs) total += secs[k]
      printf "\nTotal simulated time over all runs: %.0f s.\n", total > sum_md
    }' "$runs_csv"
  echo "regret_suite: wrote $out/summary.csv and $out/summary.md"
  plot_all
}

# --------------------------------------------------------------------------- plots
plot_all() {
  if ! command -v gnuplot > /dev/null; then
    echo "regret_suite: gnuplot not found, skipping the plots. Install it with" >&2
    echo "  sudo apt-get install -y gnuplot-nox   (deploy/install-deps.sh installs it)" >&2
    return 0
  fi
  local d
  for d in $(awk -F, 'NR > 1 && !seen[$1]++ { print $1 }' "$runs_csv"); do
    # Order to plot: s1 if it has curves, else the first order (numerically) that has any.
    local o=""
    for cand in $(awk -F, -v d="$d" 'NR > 1 && $1 == d { print substr($3, 2) }' "$runs_csv" | sort -n -u); do
      if compgen -G "$out/curves/$d.*.s$cand.csv*" > /dev/null; then o="s$cand"; break; fi
    done
    if [[ -z "$o" ]]; then
      echo "regret_suite: no curves for $d, no plot" >&2
      continue
    fi
    local plots="" p tag f color i=0
    local colors=("#c00000" "#ff8c00" "#1f77b4" "#2ca02c" "#9467bd" "#7f7f7f" "#17becf" "#e377c2" "#bcbd22" "#8c564b")
    local plist
    plist="$( (for p in $canon_policies; do echo "$p"; done
               awk -F, -v d="$d" 'NR > 1 && $1 == d { print $2 }' "$runs_csv") | awk '!s[$0]++')"
    for p in $plist; do
      tag="${p//:/_}"
      f="$out/curves/$d.$tag.$o.csv"
      if [[ ! -s "$f" && -s "$f.gz" ]]; then
        f="< gzip -dc $f.gz"
      elif [[ ! -s "$f" ]]; then
        continue
      fi
      # Fixed colours for the canonical policies (they come first), then the rest.
      case "$p" in
        d-ucb:median_of_means) color=0 ;; d-ucb:clipped) color=1 ;; ucb1) color=2 ;;
        epsilon-greedy) color=3 ;; exp4) color=4 ;; uniform) color=5 ;;
        *) color=$((6 + i % 4)); i=$((i + 1)) ;;
      esac
      [[ -n "$plots" ]] && plots+=", "
      plots+="'$f' using 1:2 with lines lw 2 lc rgb '${colors[$color]}' title '$p'"
    done
    local vw
    vw="$(vw_best "$d")"
    if [[ -n "$vw" ]]; then
      plots+=", $vw with lines dt 2 lw 2 lc rgb 'black' title 'VW best bandit ($vw)'"
    fi
    gnuplot <<EOF
set terminal pngcairo size 1000,600 noenhanced font 'DejaVu Sans,11'
set output '$out/$d.png'
set datafile separator ','
set key outside right top
set title '$d: progressive loss by policy (order $o)'
set xlabel 'round'
set ylabel 'progressive loss (1 - mean reward so far)'
set grid
set yrange [0:1.02]
set xrange [1:*]
set autoscale xfixmax
plot $plots
EOF
    echo "regret_suite: wrote $out/$d.png (order $o)"
    if [[ $prune_curves -eq 1 ]]; then
      # Keep only the plotted order's curves, gzipped (plots read .csv or .csv.gz).
      find "$out/curves" -name "$d.*.csv*" ! -name "$d.*.$o.csv*" -delete
      find "$out/curves" -name "$d.*.$o.csv" -exec gzip -f {} +
    fi
  done
}

if [[ $summarize_only -eq 0 ]]; then run_all; fi
summarize
exit 0
}
