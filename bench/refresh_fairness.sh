#!/usr/bin/env bash
# refresh_fairness.sh: how long one problem's divergence refresh on many arms holds up
# another problem's backfill (the expert-pool round visits the problems in turn).
#
#   bench/refresh_fairness.sh [ARMS [EXPERTS]]     # default 4096 24
#
# decisiond (DECISIOND=path, default build/server/decisiond; DECISIONCTL=path; DECISIOND_FLAGS
# adds flags; --max_divergence_terms raised) serves two problems: "wide" (ARMS arms, 16
# features, EXPERTS random linear experts, divergences re-estimated at every boundary) and
# "small" (26 arms, 300 samples of bench/data/letter.csv). Random contexts are replayed
# into "wide" past its first boundary (the warm-up, 3 x ARMS rounds) and the pool catches
# up; a linear expert is registered in "small" (the floor: "wide" idle); then contexts are
# replayed into "wide" in chunks of 50 until its next boundary is due
# (decision_batch_lag_rounds > 0), when its refresh over 2048 contexts starts, and at once
# a second expert is registered in "small". The script prints how long each registration
# took and how long until the expert was ACTIVE (its backfill; polled every 50 ms with
# decisionctl), and how long "wide" took to pass its boundary (its refresh).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/wait_for_decisiond.sh
arms="${1:-4096}"
experts="${2:-24}"
decisiond="${DECISIOND:-build/server/decisiond}"
ctl_bin="${DECISIONCTL:-build/client/decisionctl}"
dir="$(mktemp -d)"
port=50081 metrics=9481
# shellcheck disable=SC2086  # DECISIOND_FLAGS: several flags, split on purpose
"$decisiond" --data_dir="$dir/data" --listen=127.0.0.1:$port --metrics_listen=127.0.0.1:$metrics \
  --max_divergence_terms=1000000000000 ${DECISIOND_FLAGS:-} 2>"$dir/decisiond.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
ctl() { "$ctl_bin" --server=127.0.0.1:$port "$@"; }
wait_for_decisiond $pid "$dir/decisiond.log" ctl health
now() { date +%s.%N; }
lag() {
  curl -s 127.0.0.1:$metrics/metrics |
    awk '/^decision_batch_lag_rounds\{problem="wide"\}/ {print $2}'
}

# Random contexts (16 features in [0, 1), a random label) in chunks of 50 rows, and random
# linear experts (one row per arm: bias, then 16 weights).
python3 - "$dir" "$arms" "$experts" <<'EOF'
import random, sys
d, arms, experts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1)
header = ",".join(f"f{i}" for i in range(16)) + ",label\n"
def rows(n):
    return "".join(",".join(f"{rng.random():.4f}" for _ in range(16)) + f",{rng.randrange(arms)}\n"
                   for _ in range(n))
open(f"{d}/fill.csv", "w").write(header + rows(3 * arms + 50))
for c in range(80):
    open(f"{d}/chunk{c}.csv", "w").write(header + rows(50))
with open(f"{d}/small.csv", "w") as f:
    for a in range(26):
        f.write(",".join(f"{rng.gauss(0, 0.5):.4f}" for _ in range(17)) + "\n")
for e in range(experts):
    with open(f"{d}/expert{e}.csv", "w") as f:
        for a in range(arms):
            f.write(",".join(f"{rng.gauss(0, 0.5):.4f}" for _ in range(17)) + "\n")
EOF

ctl create-problem wide --arms="$arms" --features=16 --divergence_refresh_turnover=0 >/dev/null
for ((e = 0; e < experts; e++)); do
  ctl register-expert wide --name="e$e" --linear="$dir/expert$e.csv" >/dev/null
done
ctl create-problem small --arms=26 --features=16 >/dev/null
ctl replay small --data=bench/data/letter.csv --rounds=300 >/dev/null
ctl replay wide --data="$dir/fill.csv" >/dev/null
while [[ "$(lag)" != "0" ]]; do sleep 0.5; done
# Registers expert $1 in "small" and waits until it is ACTIVE (and, with $2 = wide, until
# "wide" has passed its boundary too); sets backfill (and refresh) to the seconds taken.
register_and_wait() {
  local start
  start="$(now)"
  ctl register-expert small --name="$1" --linear="$dir/small.csv" >/dev/null
  registered="$(echo "$(now) - $start" | bc)"
  backfill="" refresh=""
  [[ "${2:-}" == wide ]] || refresh=-
  while [[ -z "$backfill" || -z "$refresh" ]]; do
    if [[ -z "$backfill" ]] && ctl list-experts small | grep -w "$1" | grep -q -w active; then
      backfill="$(echo "$(now) - $start" | bc)"
    fi
    if [[ -z "$refresh" && "$(lag)" == "0" ]]; then
      refresh="$(echo "$(now) - $start" | bc)"
    fi
    sleep 0.05
  done
}
# The floor: the same registration while "wide" is idle.
register_and_wait idle
idle="$backfill" idle_registered="$registered"
chunk=0
while [[ "$(lag)" == "0" ]]; do
  ((chunk < 80)) || { echo "no boundary within 80 chunks" >&2; exit 1; }
  ctl replay wide --data="$dir/chunk$chunk.csv" >/dev/null
  chunk=$((chunk + 1))
done
register_and_wait busy wide
printf 'arms %s, experts %s: a new expert of "small" registered / ACTIVE after %.2f / %.2f s while "wide" is idle, %.2f / %.2f s while it refreshes; "wide" passed its boundary after %.2f s\n' \
  "$arms" "$experts" "$idle_registered" "$idle" "$registered" "$backfill" "$refresh"
