#!/usr/bin/env bash
# A soak run of decisiond (not part of CI; bench/README.md, "Soak"): runs the already built
# build/bench/decision_soak against a decisiond binary, then plots its timeline with gnuplot.
# Builds nothing.
#
# Usage: bench/soak.sh DECISIOND OUT_DIR [decision_soak flags...]
#   e.g. bench/soak.sh build/server/decisiond bench/results/soak              # 10 minutes
#        bench/soak.sh build/server/decisiond /tmp/soak-smoke --duration_s=60 \
#            --warm_up_s=20                                                    # smoke run
# A copy of decisiond needs decision_model_probe beside it (decisiond looks for the probe in
# its own directory): copy both (`cp build/server/{decisiond,decision_model_probe} DIR/`).
# Environment: SOAK_BIN (default build/bench/decision_soak); PIN=0 to run unpinned (by
# default decisiond runs on CPU 0 and the soak client on CPU 1, as the other load
# benchmarks do on this 2-core machine).
# Writes OUT_DIR/{timeline.csv,events.csv,summary.txt,decisiond.log,soak.png}; exits with
# decision_soak's status (non-zero if a check failed), after plotting either way.
set -uo pipefail
if (($# < 2)); then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
decisiond=$(realpath "$1") out=$2
shift 2
bin=${SOAK_BIN:-$root/build/bench/decision_soak}
if [[ ! -x $bin || ! -x $decisiond ]]; then
  echo "soak.sh: build first: cmake --build build --target decisiond decision_soak" >&2
  exit 2
fi
mkdir -p "$out"
pin_client=() pin_server=()
if [[ ${PIN:-1} != 0 ]] && command -v taskset > /dev/null && (($(nproc) >= 2)); then
  pin_client=(taskset -c 1) pin_server=(--decisiond_cpu=0)
fi
cd "$root"  # the data sets' default paths are relative to the repository root
"${pin_client[@]}" "$bin" --decisiond="$decisiond" --out_dir="$out" "${pin_server[@]}" "$@"
status=$?

if ! command -v gnuplot > /dev/null; then
  echo "soak.sh: gnuplot not found, no soak.png. Install it with" >&2
  echo "  sudo apt-get install -y gnuplot-nox   (deploy/install-deps.sh installs it)" >&2
  exit $status
fi
if [[ ! -s $out/timeline.csv ]]; then
  echo "soak.sh: no timeline.csv to plot" >&2
  exit $status
fi
# Vertical lines at the restarts (events.csv: "t,SIGTERM restart", "t,SIGKILL restart",
# "t,SIGTERM (warm-up) restart") and where the measured run starts after the warm-up.
marks=$(awk -F, '$2 == "measured run starts" {
  printf "set arrow from %s, graph 0 to %s, graph 1 nohead lw 2 lc rgb \"gray\"\n", $1, $1;
  printf "set label \"measured\" at %s, graph 0.84 left offset 0.5,0 tc rgb \"gray\"\n", $1 }
  $2 ~ /^SIG(TERM|KILL)( \(warm-up\))? restart$/ { split($2, w, " ");
  printf "set arrow from %s, graph 0 to %s, graph 1 nohead lw 2 dt 2 lc rgb \"%s\"\n", $1, $1,
         (w[1] == "SIGKILL" ? "red" : "orange");
  printf "set label \"%s\" at %s, graph 0.92 left offset 0.5,0 tc rgb \"%s\"\n", w[1], $1,
         (w[1] == "SIGKILL" ? "red" : "orange") }' "$out/events.csv")
# Columns by name (timeline.csv's header). gnuplot warns about a curve without points (no
# error at all): that warning is dropped.
gnuplot 2> >(grep -v 'no valid points' >&2) <<EOF
set terminal pngcairo size 1100,1250 noenhanced font 'DejaVu Sans,10'
set output '$out/soak.png'
set datafile separator ','
set datafile missing 'NaN'
set key autotitle columnhead top left
set grid
set multiplot layout 5,1 title "decision_soak: $(grep -m1 '^result' "$out/summary.txt" 2> /dev/null)"
set lmargin 12
$marks
f = '$out/timeline.csv'
set ylabel 'MiB'
plot f using 1:(column('rss_kb')/1024) with lines lw 2 title 'decisiond RSS', \
     f using 1:(column('heap_in_use_bytes')/1048576) with lines lw 1 title 'heap in use (decision_allocator_bytes)', \
     f using 1:(column('problem_bytes')/1048576) with lines lw 1 title 'problem memory (decision_problem_memory_bytes)', \
     f using 1:(column('memtable_bytes')/1048576) with lines lw 1 title 'RocksDB memtables', \
     f using 1:(column('block_cache_bytes')/1048576) with lines lw 1 title 'RocksDB block cache'
set ylabel 'count'
plot f using 1:(column('fds')) with lines lw 2 title 'open fds', \
     f using 1:(column('threads')) with lines lw 2 title 'threads', \
     f using 1:(column('experts')) with lines lw 1 title 'experts in the logs', \
     f using 1:(column('sst_files')) with lines lw 1 title 'live SST files', \
     f using 1:(column('experts_loaded')) with lines lw 1 title 'models in memory', \
     f using 1:(column('letter_active')) with lines lw 1 title 'soak-letter active experts'
set ylabel 'MiB'
plot f using 1:(column('sst_bytes')/1048576) with lines lw 2 title 'SST bytes', \
     f using 1:(column('dir_bytes')/1048576) with lines lw 1 title 'data dir (SST, WAL, ...)'
set ylabel '% of a core / ms'
plot f using 1:(column('cpu_pct')) with lines lw 1 title 'decisiond CPU %', \
     f using 1:(column('latency_p99_ms')) with lines lw 1 title 'client latency p99 (ms)'
set ylabel 'RPCs per second'
set xlabel 'seconds since the load started'
set logscale y
set yrange [0.8:*]
plot f using 1:(column('run_errors') > 0 ? column('run_errors') : 1/0) with impulses lw 3 lc rgb 'red' title 'errors outside injected windows', \
     f using 1:(column('inj_errors') > 0 ? column('inj_errors') : 1/0) with impulses lw 3 lc rgb 'orange' title 'errors in injected windows', \
     f using 1:(column('rpcs') > 0 ? column('rpcs') : 1/0) with lines lc rgb 'gray' title 'all RPCs'
unset multiplot
EOF
echo "soak.sh: wrote $out/soak.png"
exit $status
