#!/usr/bin/env bash
# The test command: installs what is needed, builds, and runs the whole test suite (./build,
# Release). Then it runs the unit, service and integration tests again in two sanitizer
# builds: AddressSanitizer+UndefinedBehaviorSanitizer (./build-asan) and ThreadSanitizer
# (./build-tsan); README.md "Sanitizers" says what they check and what they cannot.
#
# SANITIZERS=0 deploy/test.sh skips the sanitizer stages (a quick local run); ignored when
# CI=true: CI always runs them.
set -euo pipefail
cd "$(dirname "$0")/.."

# The wall time of each step, printed at the end, pass or fail: what CI's 20 minutes go to
# (bench/README.md, "CI's build and test time").
times=()
timed() {
  local name=$1 start=$SECONDS status=0
  shift
  "$@" || status=$?
  times+=("$(printf '%-22s %5d' "$name" $((SECONDS - start)))")
  return "$status"
}
report_times() {
  echo "test.sh: wall time in seconds:"
  printf '  %s\n' "${times[@]}" "$(printf '%-22s %5d' total "$SECONDS")"
}
trap report_times EXIT

timed "install and build" deploy/build.sh
timed "build: tests" ctest --test-dir build --output-on-failure -j "${JOBS:-2}"

if [[ "${SANITIZERS:-1}" == 0 ]]; then
  if [[ "${CI:-}" == true ]]; then
    echo "test.sh: CI=true, so SANITIZERS=0 is ignored"
  else
    echo "test.sh: SANITIZERS=0, skipping the sanitizer stages"
    exit 0
  fi
fi

# What the sanitizer stages build: the unit tests of core/ (xgboost_expert_test,
# xgboost_trainer_test and regret_test spend their time in uninstrumented XGBoost or in
# long simulations), the in-process service tests, and the integration tests with the
# decisiond they start. Every test of these executables runs; ctest lists the tests of
# targets not built as *_NOT_BUILT, and e2e_prometheus, e2e_haproxy and e2e_decisionctl
# need decisionctl (their decisiond code runs sanitized in the tests above: placement in
# server_units_test).
#
# The tests that run on one thread (the code they test starts none either) run in the ASan
# stage only: ThreadSanitizer reports races between threads, and in them there is nothing
# for it to check. They were about 130 s of the TSan stage's test time.
single_threaded=(numeric_test kernels_test expert_test estimator_test policy_test
                 event_id_filter_test xgboost_model_check_test)
threaded=(divergence_test server_units_test service_test concurrency_test fault_test
          integration_test security_test model_sandbox_test store_fault_test
          training_job_test scoring_cost_test move_test)
not_run='_NOT_BUILT$|^e2e_prometheus$|^e2e_haproxy$|^e2e_decisionctl$'
supp="$PWD/deploy/sanitizers"

# Configures $1 with DECISION_SANITIZE=$2, builds the targets $4..., and runs their tests
# but $not_run and those matching $3. Sanitizer reports go to files under
# $1/sanitizer-reports (log_path in the *SAN_OPTIONS below), so that a report from a
# decisiond the test killed, or from a test that passed anyway, still fails the stage.
sanitizer_stage() {
  local dir=$1 sanitize=$2 skip=$3 targets=("${@:4}")
  echo "test.sh: $dir (-fsanitize=$sanitize)"
  # Debug: assertions on; CMakeLists.txt adds -O1 -g1 for sanitized builds, and
  # tests/CMakeLists.txt -O0 (and no UBSan with ASan) for the test files. (set -e does not
  # apply inside a function called with ||, hence the explicit returns.)
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDECISION_SANITIZE="$sanitize" \
    -DDECISION_BUILD_BENCH=OFF || return 1
  rm -rf "$dir/sanitizer-reports"
  mkdir -p "$dir/sanitizer-reports"
  timed "$dir: build" cmake --build "$dir" -j "${JOBS:-2}" --target "${targets[@]}" \
    || return 1
  local status=0
  timed "$dir: tests" ctest --test-dir "$dir" --output-on-failure -j "${JOBS:-2}" \
    --timeout 300 -E "$not_run${skip:+|$skip}" || status=1
  if compgen -G "$dir/sanitizer-reports/*" > /dev/null; then
    echo "test.sh: sanitizer reports in $dir/sanitizer-reports:"
    cat "$dir"/sanitizer-reports/*
    status=1
  fi
  return "$status"
}

failed=()

# ASan + UBSan, with leak detection. UBSan ignores log_path next to ASan (GCC 12) and
# prints to stderr, but -fno-sanitize-recover ends the process, which fails the test.
reports="$PWD/build-asan/sanitizer-reports"
export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1"
ASAN_OPTIONS+=":check_initialization_order=1:strict_init_order=1:log_path=$reports/asan"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp"
export UBSAN_OPTIONS="print_stacktrace=1:suppressions=$supp/ubsan.supp"
# The ASan stage also replays every committed fuzz input (fuzz_corpus_test,
# tests/fuzz/README.md): the parsers' regression inputs under ASan and UBSan. It loads
# XGBoost models, as integration_test's decisiond does, but only models CheckXgboostModel
# accepted: the reason xgboost_*_test stay out (libxgboost fed unchecked garbage, where ASan
# aborts on its huge allocation) does not apply, and its XGBoost work takes a second. It
# checks parsers, not concurrency: it is not in the TSan stage.
sanitizer_stage build-asan "address,undefined" "" "${single_threaded[@]}" "${threaded[@]}" \
  fuzz_corpus_test || failed+=(build-asan)
unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS

# TSan. ignore_noninstrumented_modules: accesses the uninstrumented Debian libraries make
# through libc (memcpy, free, ...) are not recorded; deploy/sanitizers/tsan.supp says why.
# tsan_canary checks that the build sees absl::Mutex and still reports a real race.
reports="$PWD/build-tsan/sanitizer-reports"
export TSAN_OPTIONS="ignore_noninstrumented_modules=1:second_deadlock_stack=1"
TSAN_OPTIONS+=":suppressions=$supp/tsan.supp:log_path=$reports/tsan"
sanitizer_stage build-tsan thread '' "${threaded[@]}" tsan_canary || failed+=(build-tsan)
unset TSAN_OPTIONS

if ((${#failed[@]} > 0)); then
  echo "test.sh: sanitizer stages failed: ${failed[*]}"
  exit 1
fi
