#!/usr/bin/env bash
# refresh_fairness.sh: how long one problem's divergence refresh on many arms holds up
# another problem's backfill (the expert-pool round visits the problems in turn).
#
#   bench/refresh_fairness.sh [ARMS [EXPERTS]]     # default 4096 24
#
# decisiond (DECISIOND=path, default build/server/decisiond; --max_divergence_terms
# raised) serves two problems: "wide" (ARMS arms, 16 features, EXPERTS random linear
# experts, divergences re-estimated at every boundary) and "small" (26 arms, 300 samples
# of bench/data/letter.csv). Random contexts are replayed into "wide" until its reservoir
# is full and the pool has caught up, then in chunks of 50 until the next boundary is due
# (decision_batch_lag_rounds > 0): its refresh starts, over 2048 contexts. At once a linear
# expert is registered in "small"; the script prints how long that expert took to become
# ACTIVE (its backfill) and how long "wide" took to pass its boundary (its refresh).
set -euo pipefail
cd "$(dirname "$0")/.."
arms="${1:-4096}"
experts="${2:-24}"
decisiond="${DECISIOND:-build/server/decisiond}"
ctl_bin="${DECISIONCTL:-build/client/decisionctl}"
dir="$(mktemp -d)"
port=50081 metrics=9481
"$decisiond" --data_dir="$dir/data" --listen=127.0.0.1:$port --metrics_listen=127.0.0.1:$metrics \
  --max_divergence_terms=1000000000000 2>"$dir/decisiond.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
ctl() { "$ctl_bin" --server=127.0.0.1:$port "$@"; }
until ctl health >/dev/null 2>&1; do sleep 0.2; done
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
open(f"{d}/fill.csv", "w").write(header + rows(2600))
for c in range(40):
    open(f"{d}/chunk{c}.csv", "w").write(header + rows(50))
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
chunk=0
while [[ "$(lag)" == "0" ]]; do
  ((chunk < 40)) || { echo "no boundary within 40 chunks" >&2; exit 1; }
  ctl replay wide --data="$dir/chunk$chunk.csv" >/dev/null
  chunk=$((chunk + 1))
done
start="$(now)"
ctl register-expert small --name=new --linear=<(
  python3 -c 'import random; r = random.Random(2); print("\n".join(",".join(f"{r.gauss(0, 0.5):.4f}" for _ in range(17)) for _ in range(26)))'
) >/dev/null
backfill=""
refresh=""
while [[ -z "$backfill" || -z "$refresh" ]]; do
  if [[ -z "$backfill" ]] && ctl list-experts small | grep -w new | grep -q ACTIVE; then
    backfill="$(echo "$(now) - $start" | bc)"
  fi
  if [[ -z "$refresh" && "$(lag)" == "0" ]]; then
    refresh="$(echo "$(now) - $start" | bc)"
  fi
  sleep 0.05
done
printf 'arms %s, experts %s: the new expert of "small" ACTIVE after %.2f s; "wide" passed its boundary after %.2f s\n' \
  "$arms" "$experts" "$backfill" "$refresh"
