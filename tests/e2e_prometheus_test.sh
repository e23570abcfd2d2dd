#!/usr/bin/env bash
# End-to-end test of the observability files (deploy/prometheus, deploy/grafana) against the
# real tools: a real decisiond on free loopback ports, a real Prometheus (Debian's package,
# installed by deploy/install-deps.sh) running the project's scrape config and alert rules
# against it, a short replay driven by decisionctl, then:
#   - the regret, per-expert and divergence series exist in Prometheus with plausible values;
#   - every PromQL expression of the dashboard and of the alert rules runs without error
#     (and every dashboard expression returns data);
#   - every metric name the dashboard and the rules use is one decisiond exports;
#   - promtool check config / check rules pass, the alert rules fire in the scenarios they
#     are written for and stay silent on a healthy replica (promtool test rules), and the
#     metrics endpoint passes promtool check metrics.
#
# Usage: tests/e2e_prometheus_test.sh DECISIOND DECISIONCTL SOURCE_DIR   (ctest passes them)
set -euo pipefail

source "$(dirname "$0")/e2e_common.sh" "$@"
PROM_SRC=$ROOT/deploy/prometheus
DASHBOARD=$ROOT/deploy/grafana/dashboards/decisiond.json
PROBLEM=digits
ROUNDS=600

for tool in prometheus promtool curl jq; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (deploy/install-deps.sh installs it)"
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/e2e_prometheus.XXXXXX")
PIDS=()
cleanup() {
  local rc=$?
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if ((rc != 0)); then
    for log in decisiond.err prometheus.log; do
      if [[ -s "$WORK/$log" ]]; then
        echo "--- last lines of $log" >&2
        tail -n 20 "$WORK/$log" >&2
      fi
    done
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
START=$SECONDS

# ---------------------------------------------------------------- static checks
step "promtool check config on deploy/prometheus/prometheus.yml (and the rule files it names)"
promtool check config --lint=all --lint-fatal "$PROM_SRC/prometheus.yml" >/dev/null ||
  fail "promtool check config $PROM_SRC/prometheus.yml"
ok "valid"

step "promtool check rules on deploy/prometheus/alerts.yml"
promtool check rules --lint=all --lint-fatal "$PROM_SRC/alerts.yml" >/dev/null ||
  fail "promtool check rules $PROM_SRC/alerts.yml"
ok "valid"

step "promtool test rules: each alert fires in its scenario, none on a healthy replica"
SERIES_LABELS='job="decisiond",instance="a:9464"'
cat >"$WORK/alerts_test.yml" <<EOF
rule_files:
  - $PROM_SRC/alerts.yml
evaluation_interval: 1m
tests:
  # A healthy replica: 10 decisions/s, rewarded in time, fast RPCs and writes, a finished
  # backfill, a steady number of pending decisions: nothing fires.
  - interval: 1m
    input_series:
      - series: 'up{$SERIES_LABELS}'
        values: '1x130'
      - series: 'decision_store_healthy{$SERIES_LABELS}'
        values: '1x130'
      - series: 'decision_decisions_total{$SERIES_LABELS,problem="p"}'
        values: '0+600x130'
      - series: 'decision_rewards_total{$SERIES_LABELS,problem="p",outcome="learned"}'
        values: '0+595x130'
      - series: 'decision_rewards_total{$SERIES_LABELS,problem="p",outcome="late"}'
        values: '0+1x130'
      - series: 'decision_expired_total{$SERIES_LABELS,problem="p",handling="default"}'
        values: '0+4x130'
      - series: 'decision_pending{$SERIES_LABELS,problem="p"}'
        values: '20+0x130'
      - series: 'decision_expert_estimate{$SERIES_LABELS,problem="p",expert="1"}'
        values: '0.3x130'
      - series: 'decision_expert_selected_total{$SERIES_LABELS,problem="p",expert="1"}'
        values: '0+600x130'
      - series: 'decision_expert_backfill_progress{$SERIES_LABELS,problem="p",expert="1"}'
        values: '0+0.1x10 1x120'
      - series: 'decision_rpc_latency_seconds_count{$SERIES_LABELS,method="Choose"}'
        values: '0+600x130'
      - series: 'decision_rpc_latency_seconds_bucket{$SERIES_LABELS,method="Choose",le="0.001"}'
        values: '0+600x130'
      - series: 'decision_rpc_latency_seconds_bucket{$SERIES_LABELS,method="Choose",le="+Inf"}'
        values: '0+600x130'
      - series: 'decision_rpc_errors_total{$SERIES_LABELS,method="Choose",code="INVALID_ARGUMENT"}'
        values: '0+1x130'
      - series: 'decision_storage_write_latency_seconds_bucket{$SERIES_LABELS,le="0.001"}'
        values: '0+1200x130'
      - series: 'decision_storage_write_latency_seconds_bucket{$SERIES_LABELS,le="+Inf"}'
        values: '0+1200x130'
    promql_expr_test:
      - expr: ALERTS
        eval_time: 125m
        exp_samples: []

  # The scrape fails.
  - interval: 1m
    input_series:
      - series: 'up{$SERIES_LABELS}'
        values: '1 1 0x10'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 6m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondDown",alertstate="firing",severity="critical",$SERIES_LABELS}'
            value: 1

  # 10% of Choose calls fail (1% of Reward calls: below the threshold).
  - interval: 1m
    input_series:
      - series: 'decision_rpc_latency_seconds_count{$SERIES_LABELS,method="Choose"}'
        values: '0+600x30'
      - series: 'decision_rpc_errors_total{$SERIES_LABELS,method="Choose",code="NOT_FOUND"}'
        values: '0+60x30'
      - series: 'decision_rpc_latency_seconds_count{$SERIES_LABELS,method="Reward"}'
        values: '0+600x30'
      - series: 'decision_rpc_errors_total{$SERIES_LABELS,method="Reward",code="NOT_FOUND"}'
        values: '0+6x30'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 20m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondRpcErrorRateHigh",alertstate="firing",severity="warning",$SERIES_LABELS,method="Choose"}'
            value: 1

  # Every Choose takes 10-100 ms.
  - interval: 1m
    input_series:
      - series: 'decision_rpc_latency_seconds_bucket{$SERIES_LABELS,method="Choose",le="0.01"}'
        values: '0x30'
      - series: 'decision_rpc_latency_seconds_bucket{$SERIES_LABELS,method="Choose",le="0.1"}'
        values: '0+600x30'
      - series: 'decision_rpc_latency_seconds_bucket{$SERIES_LABELS,method="Choose",le="+Inf"}'
        values: '0+600x30'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 20m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondChooseLatencyHigh",alertstate="firing",severity="warning",$SERIES_LABELS}'
            value: 1

  # Decisions at 1/s and no reward: rewards stopped at once, and later every decision is
  # learned with the default reward.
  - interval: 1m
    input_series:
      - series: 'decision_decisions_total{$SERIES_LABELS,problem="p"}'
        values: '0+60x90'
      - series: 'decision_rewards_total{$SERIES_LABELS,problem="p",outcome="learned"}'
        values: '0x90'
      - series: 'decision_rewards_total{$SERIES_LABELS,problem="p",outcome="late"}'
        values: '0x90'
      - series: 'decision_expired_total{$SERIES_LABELS,problem="p",handling="default"}'
        values: '0+60x90'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 20m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondRewardsStopped",alertstate="firing",severity="critical",$SERIES_LABELS,problem="p"}'
            value: 1
      - expr: ALERTS{alertstate="firing"}
        eval_time: 80m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondRewardsStopped",alertstate="firing",severity="critical",$SERIES_LABELS,problem="p"}'
            value: 1
          - labels: 'ALERTS{alertname="DecisiondDefaultRewardShareHigh",alertstate="firing",severity="warning",$SERIES_LABELS,problem="p"}'
            value: 1

  # A third of the rewards arrive after the wait time.
  - interval: 1m
    input_series:
      - series: 'decision_decisions_total{$SERIES_LABELS,problem="p"}'
        values: '0+60x40'
      - series: 'decision_rewards_total{$SERIES_LABELS,problem="p",outcome="learned"}'
        values: '0+40x40'
      - series: 'decision_rewards_total{$SERIES_LABELS,problem="p",outcome="late"}'
        values: '0+20x40'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 35m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondLateRewards",alertstate="firing",severity="warning",$SERIES_LABELS,problem="p"}'
            value: 1

  # The followed expert 1 drops from 0.3 to 0.1 at minute 60; expert 0, never followed,
  # stays at 0.05 and must not count.
  - interval: 1m
    input_series:
      - series: 'decision_expert_estimate{$SERIES_LABELS,problem="p",expert="0"}'
        values: '0.05x130'
      - series: 'decision_expert_selected_total{$SERIES_LABELS,problem="p",expert="0"}'
        values: '0x130'
      - series: 'decision_expert_estimate{$SERIES_LABELS,problem="p",expert="1"}'
        values: '0.3x59 0.1x70'
      - series: 'decision_expert_selected_total{$SERIES_LABELS,problem="p",expert="1"}'
        values: '0+60x130'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 55m
        exp_samples: []
      - expr: ALERTS{alertstate="firing"}
        eval_time: 100m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondSelectedExpertEstimateCollapsed",alertstate="firing",severity="warning",$SERIES_LABELS,problem="p"}'
            value: 1

  # Reward calls fail with INTERNAL (storage) from minute 2 on, and writes are slow.
  - interval: 1m
    input_series:
      - series: 'decision_rpc_errors_total{$SERIES_LABELS,method="Reward",code="INTERNAL"}'
        values: '0 0 1+1x24'
      - series: 'decision_storage_write_latency_seconds_bucket{$SERIES_LABELS,le="0.05"}'
        values: '0x25'
      - series: 'decision_storage_write_latency_seconds_bucket{$SERIES_LABELS,le="0.5"}'
        values: '0+100x25'
      - series: 'decision_storage_write_latency_seconds_bucket{$SERIES_LABELS,le="+Inf"}'
        values: '0+100x25'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 3m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondStorageWriteFailures",alertstate="firing",severity="critical",$SERIES_LABELS}'
            value: 1
      - expr: ALERTS{alertstate="firing"}
        eval_time: 22m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondStorageWriteFailures",alertstate="firing",severity="critical",$SERIES_LABELS}'
            value: 1
          - labels: 'ALERTS{alertname="DecisiondStorageWritesSlow",alertstate="firing",severity="warning",$SERIES_LABELS}'
            value: 1

  # The store stops writing (a full volume) for good.
  - interval: 1m
    input_series:
      - series: 'decision_store_healthy{$SERIES_LABELS}'
        values: '1 1 0x10'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 6m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondStoreCannotWrite",alertstate="firing",severity="critical",$SERIES_LABELS}'
            value: 1

  # Pending decisions grow by 100 a minute at 60 decisions a minute: nothing expires.
  - interval: 1m
    input_series:
      - series: 'decision_decisions_total{$SERIES_LABELS,problem="p"}'
        values: '0+60x40'
      - series: 'decision_rewards_total{$SERIES_LABELS,problem="p",outcome="learned"}'
        values: '0+1x40'
      - series: 'decision_pending{$SERIES_LABELS,problem="p"}'
        values: '0+100x40'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 35m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondPendingPilingUp",alertstate="firing",severity="warning",$SERIES_LABELS,problem="p"}'
            value: 1

  # Expert 3's backfill stops at half; expert 4's keeps moving.
  - interval: 1m
    input_series:
      - series: 'decision_expert_backfill_progress{$SERIES_LABELS,problem="p",expert="3"}'
        values: '0 0.25 0.5x40'
      - series: 'decision_expert_backfill_progress{$SERIES_LABELS,problem="p",expert="4"}'
        values: '0+0.02x40'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 40m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondBackfillStuck",alertstate="firing",severity="warning",$SERIES_LABELS,problem="p",expert="3"}'
            value: 1
  # Expert 2 is quarantined; expert 1 stays healthy.
  - interval: 1m
    input_series:
      - series: 'decision_expert_failed{$SERIES_LABELS,problem="p",expert="1"}'
        values: '0x10'
      - series: 'decision_expert_failed{$SERIES_LABELS,problem="p",expert="2"}'
        values: '0 0 1x8'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 5m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondExpertFailed",alertstate="firing",severity="warning",$SERIES_LABELS,problem="p",expert="2"}'
            value: 1

  # Problem q failed to load; p serves.
  - interval: 1m
    input_series:
      - series: 'decision_problem_failed{$SERIES_LABELS,problem="p"}'
        values: '0x10'
      - series: 'decision_problem_failed{$SERIES_LABELS,problem="q"}'
        values: '1x10'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 2m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondProblemFailed",alertstate="firing",severity="critical",$SERIES_LABELS,problem="q"}'
            value: 1

  # 10 of 60 decisions a minute are undelivered in p, 1 of 60 in r.
  - interval: 1m
    input_series:
      - series: 'decision_decisions_total{$SERIES_LABELS,problem="p"}'
        values: '0+60x40'
      - series: 'decision_undelivered_total{$SERIES_LABELS,problem="p"}'
        values: '0+10x40'
      - series: 'decision_rewards_total{$SERIES_LABELS,problem="p",outcome="learned"}'
        values: '0+50x40'
      - series: 'decision_decisions_total{$SERIES_LABELS,problem="r"}'
        values: '0+60x40'
      - series: 'decision_undelivered_total{$SERIES_LABELS,problem="r"}'
        values: '0+1x40'
      - series: 'decision_rewards_total{$SERIES_LABELS,problem="r",outcome="learned"}'
        values: '0+59x40'
    promql_expr_test:
      - expr: ALERTS{alertstate="firing"}
        eval_time: 30m
        exp_samples:
          - labels: 'ALERTS{alertname="DecisiondUndeliveredDecisions",alertstate="firing",severity="warning",$SERIES_LABELS,problem="p"}'
            value: 1
EOF
promtool test rules "$WORK/alerts_test.yml" >"$WORK/rules_test.out" 2>&1 || {
  cat "$WORK/rules_test.out" >&2
  fail "promtool test rules"
}
# Every alert of alerts.yml must have a scenario above.
while read -r alert; do
  grep -q "alertname=\"$alert\"" "$WORK/alerts_test.yml" || fail "alert $alert has no scenario in $0"
done < <(sed -n 's/^ *- alert: *\([A-Za-z0-9_]*\).*/\1/p' "$PROM_SRC/alerts.yml")
ok "all scenarios pass"

# ---------------------------------------------------------------- decisiond
step "start decisiond on free loopback ports"
"$DECISIOND" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --data_dir="$WORK/data" \
  --seed=1 >"$WORK/decisiond.out" 2>"$WORK/decisiond.err" &
DECISIOND_PID=$!
PIDS+=("$DECISIOND_PID")
for _ in $(seq 200); do
  grep -q '^decisiond listening on ' "$WORK/decisiond.out" && break
  kill -0 "$DECISIOND_PID" 2>/dev/null || fail "decisiond exited at start"
  sleep 0.05
done
# "decisiond listening on HOST:PORT metrics on HOST:PORT"
read -r _ _ _ GRPC_ADDRESS _ _ METRICS_ADDRESS < <(grep -m1 '^decisiond listening on ' "$WORK/decisiond.out") ||
  fail "decisiond did not print its addresses"
[[ "$GRPC_ADDRESS" == 127.0.0.1:* && "$METRICS_ADDRESS" == 127.0.0.1:* ]] ||
  fail "unexpected addresses: gRPC '$GRPC_ADDRESS', metrics '$METRICS_ADDRESS'"
ok "gRPC on $GRPC_ADDRESS, metrics on $METRICS_ADDRESS"

# ---------------------------------------------------------------- Prometheus
step "start Prometheus with deploy/prometheus/prometheus.yml pointed at that decisiond"
mkdir -p "$WORK/prometheus"
# Only the target and the two intervals change; rule_files (alerts.yml, next to the config)
# stays the project's.
sed -e "s/^\( *scrape_interval:\) 15s$/\1 1s/" \
  -e "s/^\( *evaluation_interval:\) 15s$/\1 1s/" \
  -e "s/^\( *- \)decisiond:9464$/\1$METRICS_ADDRESS/" \
  "$PROM_SRC/prometheus.yml" >"$WORK/prometheus/prometheus.yml"
cp "$PROM_SRC/alerts.yml" "$WORK/prometheus/alerts.yml"
for rewritten in "^ *scrape_interval: 1s$" "^ *evaluation_interval: 1s$" "^ *- $METRICS_ADDRESS$"; do
  grep -q -- "$rewritten" "$WORK/prometheus/prometheus.yml" ||
    fail "could not rewrite prometheus.yml to match '$rewritten' (keep the target and intervals in their form)"
done
promtool check config "$WORK/prometheus/prometheus.yml" >/dev/null || fail "rewritten config invalid"

PROM=""
for _ in $(seq 10); do
  port=$((20000 + RANDOM % 20000))
  # Something answers there already: try another port.
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then continue; fi
  prometheus --config.file="$WORK/prometheus/prometheus.yml" \
    --storage.tsdb.path="$WORK/prometheus/data" \
    --web.listen-address="127.0.0.1:$port" --log.level=warn >"$WORK/prometheus.log" 2>&1 &
  prom_pid=$!
  for _ in $(seq 150); do
    if ! kill -0 "$prom_pid" 2>/dev/null; then
      wait "$prom_pid" 2>/dev/null || true
      break # the port was taken meanwhile, or another failure: try again
    fi
    if curl -sf --max-time 2 "http://127.0.0.1:$port/-/ready" >/dev/null; then
      PROM="http://127.0.0.1:$port"
      break
    fi
    sleep 0.1
  done
  if [[ -n "$PROM" ]]; then
    PIDS+=("$prom_pid")
    break
  fi
  kill "$prom_pid" 2>/dev/null || true
  wait "$prom_pid" 2>/dev/null || true
done
[[ -n "$PROM" ]] || fail "Prometheus did not start (log: $(tail -n 3 "$WORK/prometheus.log" 2>/dev/null))"
ok "Prometheus ready at $PROM"

# query EXPR: prints Prometheus's JSON answer to the instant query EXPR.
query() {
  curl -sS --max-time 10 "$PROM/api/v1/query" --data-urlencode "query=$1"
}
# value EXPR: prints the value of the single series EXPR returns ("" if none).
value() {
  query "$1" | jq -r '.data.result[0].value[1] // ""'
}
# wait_until EXPR JQ_CONDITION SECONDS: polls until the answer to EXPR satisfies JQ_CONDITION.
wait_until() {
  local deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    if query "$1" | jq -e "$2" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  return 1
}

# ---------------------------------------------------------------- drive a replay
step "drive decisiond: problem $PROBLEM with auto-training, a linear expert, two bad calls, $ROUNDS rounds"
C=("$DECISIONCTL" --server="$GRPC_ADDRESS")
"${C[@]}" create-problem "$PROBLEM" --arms=10 --features=64 --auto_train >/dev/null
# A fixed linear softmax expert (per arm: bias and 64 weights), so there are pairs of experts
# from the start.
awk 'BEGIN { for (a = 0; a < 10; a++) { line = ""; for (f = 0; f < 65; f++)
  line = line sprintf("%s%.4f", f ? " " : "", 0.05 * sin(a * 65 + f)); print line } }' \
  >"$WORK/linear.txt"
"${C[@]}" register-expert "$PROBLEM" --name=linear --linear="$WORK/linear.txt" >/dev/null
# Two failing calls, so that the error series exist: a wrong feature count
# (INVALID_ARGUMENT) and a reward for an unknown event (NOT_FOUND).
if "${C[@]}" choose "$PROBLEM" --x=1,2 >/dev/null 2>&1; then fail "choose with 2 features succeeded"; fi
if "${C[@]}" reward "$PROBLEM" no-such-event 1 >/dev/null 2>&1; then fail "reward of an unknown event succeeded"; fi
# --keep_schedule: at each batch boundary the replay waits for its training and backfill,
# so when it returns no job is queued or running and no expert is backfilling.
"${C[@]}" replay "$PROBLEM" --data="$ROOT/bench/data/digits.csv" \
  --order="$ROOT/bench/data/orders/digits.s1.perm.txt" --rounds="$ROUNDS" --keep_schedule | tail -n 1
jobs=$("${C[@]}" jobs "$PROBLEM")
[[ "$(grep -c SUCCEEDED <<<"$jobs")" -ge 2 ]] || fail "fewer than 2 training jobs succeeded: $jobs"
if grep -Eq "QUEUED|RUNNING" <<<"$jobs"; then fail "a job is not done after --keep_schedule: $jobs"; fi
if "${C[@]}" list-experts "$PROBLEM" | grep -q BACKFILLING; then
  fail "an expert is still backfilling after --keep_schedule"
fi
ok "replay done, with every batch boundary's training and backfill done"

step "wait until Prometheus has scraped the final state"
wait_until "decision_decisions_total{problem=\"$PROBLEM\"}" \
  "(.data.result | length) == 1 and .data.result[0].value[1] == \"$ROUNDS\"" 30 ||
  fail "decision_decisions_total{problem=\"$PROBLEM\"} never reached $ROUNDS in Prometheus: $(query "decision_decisions_total")"
wait_until "count(decision_divergence_mij{problem=\"$PROBLEM\"})" '(.data.result | length) == 1' 20 ||
  fail "no decision_divergence_mij series for $PROBLEM"
# A few more scrapes, so that every rate window holds several samples after the replay.
sleep 3
ok "scraped"

# ---------------------------------------------------------------- series and values
step "per-problem series"
[[ "$(value "up{job=\"decisiond\"}")" == 1 ]] || fail "up{job=\"decisiond\"} is not 1"
v=$(value "decision_decisions_total{problem=\"$PROBLEM\"}")
[[ "$v" == "$ROUNDS" ]] || fail "decision_decisions_total = '$v', want $ROUNDS"
ok "decision_decisions_total = $v"
v=$(value "decision_rewards_total{problem=\"$PROBLEM\",outcome=\"learned\"}")
[[ "$v" == "$ROUNDS" ]] || fail "decision_rewards_total{outcome=learned} = '$v', want $ROUNDS"
ok "decision_rewards_total{outcome=\"learned\"} = $v"
v=$(value "decision_reward_sum_total{problem=\"$PROBLEM\"}")
jq -en --arg v "$v" --argjson n "$ROUNDS" '$v | tonumber | . >= 0 and . <= $n' >/dev/null ||
  fail "decision_reward_sum_total = '$v', want in [0, $ROUNDS]"
ok "decision_reward_sum_total = $v"
v=$(value "decision_estimated_regret{problem=\"$PROBLEM\"}")
[[ -n "$v" && ! "$v" =~ ^[-+]?(Inf|NaN)$ ]] || fail "decision_estimated_regret = '$v', want a finite number"
jq -en --arg v "$v" --argjson n "$ROUNDS" '$v | tonumber | . >= -1e-6 and . <= $n' >/dev/null ||
  fail "decision_estimated_regret = '$v', want in [0, $ROUNDS]"
ok "decision_estimated_regret = $v"
v=$(value "decision_pending{problem=\"$PROBLEM\"}")
[[ "$v" == 0 ]] || fail "decision_pending = '$v', want 0 (every decision was rewarded)"
ok "decision_pending = 0"

step "per-expert series"
# all_in EXPR LO HI MIN: EXPR returns at least MIN series, each a number in [LO, HI]: finite,
# or +Inf when HI is "+Inf" (an upper confidence bound with no information behind it).
all_in() {
  local answer
  answer=$(query "$1")
  jq -e --argjson lo "$2" --arg hi "$3" --argjson min "$4" '
      .status == "success" and (.data.result | length) >= $min and
      all(.data.result[]; .value[1] as $v |
          if $v == "+Inf" then $hi == "+Inf"
          elif ($v | test("^[-+]?(Inf|NaN)$")) then false
          else ($v | tonumber) >= $lo and ($hi == "+Inf" or ($v | tonumber) <= ($hi | tonumber))
          end)' <<<"$answer" >/dev/null ||
    fail "$1: want >= $4 series with values in [$2, $3], got $(jq -c '[.data.result[]? | {m: .metric, v: .value[1]}]' <<<"$answer")"
  ok "$1: $(jq '.data.result | length' <<<"$answer") series in [$2, $3]"
}
# Importance-weighted means of rewards in [0, 1]: never negative, and above 1 only by the
# estimator's variance, at most the largest ratio pi_k / pi_j <= K / eta = 10 / 0.05.
all_in "decision_expert_estimate{problem=\"$PROBLEM\"}" 0 200 2
all_in "decision_expert_ucb{problem=\"$PROBLEM\"}" 0 +Inf 2
all_in "decision_expert_backfill_progress{problem=\"$PROBLEM\"}" 0 1 2
# Seconds of CPU per row to score an expert: 0 for the uniform one, microseconds for linear.
all_in "decision_expert_score_cost_seconds{problem=\"$PROBLEM\"}" 0 1 2
all_in "decision_expert_effective_sample_size{problem=\"$PROBLEM\"}" 0 1e12 2
all_in "decision_expert_selected_total{problem=\"$PROBLEM\"}" 0 "$ROUNDS" 2
[[ "$(query "decision_expert_ucb{problem=\"$PROBLEM\"} < decision_expert_estimate{problem=\"$PROBLEM\"}" |
  jq '.data.result | length')" == 0 ]] || fail "an expert's UCB is below its estimate"
ok "UCB >= estimate for every expert"
v=$(value "sum(decision_expert_selected_total{problem=\"$PROBLEM\"})")
[[ "$v" == "$ROUNDS" ]] || fail "sum of decision_expert_selected_total = '$v', want $ROUNDS (one expert per decision)"
ok "selections sum to $ROUNDS"
# Experts 0 (uniform) and 1 (linear) are active from the start, so both were followed.
for e in 0 1; do
  v=$(value "decision_expert_selected_total{problem=\"$PROBLEM\",expert=\"$e\"}")
  [[ -n "$v" ]] || fail "no decision_expert_selected_total for expert $e"
done
ok "series for the uniform expert 0 and the registered linear expert 1"

step "divergence series"
all_in "decision_divergence_mij{problem=\"$PROBLEM\"}" 0.999999999 1e12 2
all_in "decision_divergence_sigmaij{problem=\"$PROBLEM\"}" 0.999999999 1e12 2
n_m=$(query "decision_divergence_mij{problem=\"$PROBLEM\"}" | jq '.data.result | length')
n_sigma=$(query "decision_divergence_sigmaij{problem=\"$PROBLEM\"}" | jq '.data.result | length')
[[ "$n_m" == "$n_sigma" ]] || fail "$n_m M series but $n_sigma sigma series"
[[ "$(query "decision_divergence_mij{problem=\"$PROBLEM\"}" |
  jq '[.data.result[] | select(.metric.expert_i == .metric.expert_j)] | length')" == 0 ]] ||
  fail "a divergence series of an expert with itself"
# Pairs come both ways: (i, j) and (j, i).
[[ "$(query "decision_divergence_mij{problem=\"$PROBLEM\"}" | jq '
    [.data.result[].metric | "\(.expert_i),\(.expert_j)"] as $pairs
    | [$pairs[] | split(",") | "\(.[1]),\(.[0])" | select(. as $p | $pairs | index($p) | not)]
    | length')" == 0 ]] || fail "divergence pairs are not symmetric"
ok "$n_m ordered pairs, each both ways, no diagonal"

# ---------------------------------------------------------------- metric names
step "every metric the dashboard and the rules use is exported"
names=$(curl -sS "$PROM/api/v1/label/__name__/values" | jq -r '.data[]')
used=$( (jq -r '[.. | objects | select(has("expr")) | .expr] | .[]' "$DASHBOARD"
  cat "$PROM_SRC/alerts.yml") | grep -o 'decision_[a-z_]*' | sort -u)
for m in $used; do
  grep -qx "$m" <<<"$names" || fail "$m is used by the dashboard or the rules but not exported"
done
ok "$(wc -w <<<"$used") metric names"
problems=$(curl -sS "$PROM/api/v1/label/problem/values" | jq -r '.data[]')
grep -qx "$PROBLEM" <<<"$problems" || fail "label_values(problem) lacks $PROBLEM (the dashboard's variable)"
ok "label_values(decision_decisions_total, problem) has $PROBLEM"

# ---------------------------------------------------------------- dashboard expressions
step "every PromQL expression of the dashboard runs and returns data"
jq -e . "$DASHBOARD" >/dev/null || fail "$DASHBOARD is not valid JSON"
n=0
# shellcheck disable=SC2016  # '$problem' and the like are Grafana's variables, not the shell's
while IFS= read -r encoded; do
  expr=$(jq -r . <<<"$encoded")
  # Grafana's variables: the problem, and the intervals Grafana computes from the range.
  e=${expr//'${problem}'/$PROBLEM}
  e=${e//'$problem'/$PROBLEM}
  for var in '${__rate_interval}' '$__rate_interval' '${__interval}' '$__interval' '${__range}' '$__range'; do
    e=${e//"$var"/1m}
  done
  [[ "$e" != *'$'* ]] || fail "unknown Grafana variable left in: $e"
  answer=$(query "$e")
  status=$(jq -r '.status // "no answer"' <<<"$answer" 2>/dev/null || echo "not JSON")
  [[ "$status" == success ]] || fail "dashboard expression failed ($status): $e: $(jq -r '.error // empty' <<<"$answer" 2>/dev/null)"
  [[ "$(jq '.data.result | length' <<<"$answer")" -gt 0 ]] || fail "dashboard expression returned no data: $e"
  n=$((n + 1))
done < <(jq -c '.. | objects | select(has("expr")) | .expr' "$DASHBOARD")
((n > 0)) || fail "no expression found in $DASHBOARD"
ok "$n expressions"

# ---------------------------------------------------------------- alert expressions
step "every alert rule is loaded, evaluates without error, and its expression runs"
want_rules=$(grep -cE '^ *- (alert|record):' "$PROM_SRC/alerts.yml")
deadline=$((SECONDS + 20))
while :; do
  rules=$(curl -sS "$PROM/api/v1/rules")
  evaluated=$(jq '[.data.groups[].rules[] | select(.lastEvaluation != "0001-01-01T00:00:00Z")] | length' <<<"$rules")
  ((evaluated >= want_rules)) && break
  ((SECONDS < deadline)) || fail "only $evaluated of $want_rules rules evaluated in 20 s"
  sleep 0.5
done
loaded=$(jq '[.data.groups[].rules[]] | length' <<<"$rules")
[[ "$loaded" == "$want_rules" ]] || fail "Prometheus loaded $loaded rules, alerts.yml has $want_rules"
bad=$(jq -c '[.data.groups[].rules[] | select(.health != "ok") | {name, health, lastError}]' <<<"$rules")
[[ "$bad" == "[]" ]] || fail "rules evaluated with errors: $bad"
n=0
while IFS= read -r encoded; do
  name=$(jq -r .name <<<"$encoded")
  e=$(jq -r .query <<<"$encoded")
  answer=$(query "$e")
  status=$(jq -r '.status // "no answer"' <<<"$answer" 2>/dev/null || echo "not JSON")
  [[ "$status" == success ]] || fail "rule $name: expression failed ($status): $e"
  n=$((n + 1))
done < <(jq -c '.data.groups[].rules[] | {name, query}' <<<"$rules")
ok "$n rules, health ok, expressions run"
firing=$(query 'ALERTS{alertstate="firing"}' | jq -c '[.data.result[].metric.alertname]')
[[ "$firing" == "[]" ]] || fail "alerts firing on a healthy replica: $firing"
ok "no alert firing"

# ---------------------------------------------------------------- promtool check metrics
step "promtool check metrics on the decisiond endpoint"
curl -sS --max-time 10 "http://$METRICS_ADDRESS/metrics" >"$WORK/metrics.txt"
grep -q '^decision_divergence_mij{' "$WORK/metrics.txt" || fail "the scrape lacks the divergence series"
set +e
promtool check metrics <"$WORK/metrics.txt" >"$WORK/lint.txt" 2>&1
lint_rc=$?
set -e
((lint_rc == 0)) || fail "promtool check metrics: exit $lint_rc: $(cat "$WORK/lint.txt")"
ok "$(grep -c '^# TYPE' "$WORK/metrics.txt") metric families parse, no lint finding"

echo "e2e_prometheus: all checks passed in $((SECONDS - START)) s"
