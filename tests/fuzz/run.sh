#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang (./build-fuzz, -DDECISION_FUZZ=ON)
# and runs each for MINUTES, one after the other (one core each: never two at once on the
# shared 2-core machine). Then prints, per target: executions, exec/s, coverage (cov and
# ft from libFuzzer's last status line) and the crash, leak, timeout and OOM inputs found.
#
#   tests/fuzz/run.sh MINUTES [TARGET...]     targets: xgboost_model expert_model request
#                                             record recovery (default: all)
#   FUZZ_RUNS=N       also stop a target after N executions (-runs=N)
#   FUZZ_TIMEOUT=S    -timeout (default 10 s; recovery_fuzz takes ~1 s an input, and
#                     several on a loaded machine)
#   FUZZ_ARGS="..."   more libFuzzer flags
#
# Each target runs on a scratch corpus, build-fuzz/fuzz-work/TARGET/corpus (kept between
# runs), seeded from the committed one, tests/fuzz/corpus/TARGET, which it only reads: the
# repository keeps its small seed corpus. Inputs that crash land in
# build-fuzz/fuzz-work/TARGET/artifacts/; once the bug is fixed, copy the (minimized,
# -minimize_crash=1) input into tests/fuzz/corpus/TARGET/ as crash-<what>: the replay test
# fuzz_corpus_test then keeps it fixed.
set -euo pipefail
cd "$(dirname "$0")/../.."
if (($# < 1)) || ! [[ $1 =~ ^[0-9]+$ ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
minutes=$1
shift
targets=("$@")
((${#targets[@]} > 0)) || targets=(xgboost_model expert_model request record recovery)
build=${FUZZ_BUILD_DIR:-build-fuzz}

deploy/install-deps.sh --fuzz
mkdir -p "$build"
# The compiler is set on the first configure only (changing it empties CMake's cache).
compiler=()
[[ -f "$build/CMakeCache.txt" ]] || compiler=(-DCMAKE_CXX_COMPILER=clang++-14)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${compiler[@]}" \
  -DDECISION_FUZZ=ON -DDECISION_BUILD_BENCH=OFF > "$build/configure.log" \
  || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j 2 --target "${targets[@]/%/_fuzz}"

supp="$PWD/deploy/sanitizers"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$supp/lsan.supp}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:suppressions=$supp/ubsan.supp}"

summary=()
for target in "${targets[@]}"; do
  work="$build/fuzz-work/$target"
  mkdir -p "$work/corpus" "$work/artifacts"
  log="$work/fuzz.log"
  echo "run.sh: $target for $minutes min (log: $log)"
  status=0
  # shellcheck disable=SC2086
  "$build/tests/fuzz/${target}_fuzz" -max_total_time=$((minutes * 60)) -rss_limit_mb=2048 \
    -timeout="${FUZZ_TIMEOUT:-10}" -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
    ${FUZZ_RUNS:+-runs=$FUZZ_RUNS} ${FUZZ_ARGS:-} \
    "$work/corpus" "tests/fuzz/corpus/$target" > "$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
  found=$(find "$work/artifacts" -type f | wc -l)
  line="$target: ${runs:-?} executions, ${speed:-?} exec/s, ${cov:-cov: ? ft: ?}, exit $status,"
  line+=" $found crash/leak/timeout/oom inputs in $work/artifacts"
  summary+=("$line")
  if ((status != 0)); then
    echo "run.sh: $target stopped with status $status; the end of its log:"
    tail -40 "$log"
  fi
done
printf '%s\n' "${summary[@]}"
