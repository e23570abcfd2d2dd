#!/usr/bin/env bash
# End-to-end test of scale-out through a real gRPC proxy (deploy/haproxy): three decisiond
# replicas behind Debian's HAProxy 2.6, with the shipped haproxy.cfg, placement map and
# place.sh. Every call goes through decisionctl, whose client library sets the
# x-decision-problem metadata the proxy routes on. It checks:
#   - CreateProblem through the proxy lands on the owner the map names, and a problem not
#     in the map on the one the consistent hash picks, where its later calls go too;
#   - 30 problems, placed or hashed, spread over the three replicas, each on exactly one,
#     with every reward sent through the proxy learned by its owner;
#   - a replica refuses a call for a problem placed on the other one, naming the owner,
#     and never creates it;
#   - place.sh changes the placement at runtime (HAProxy's runtime API, the map file and
#     SIGHUP to the replicas), without restarting anything;
#   - kill -9 of one replica: the other's problems keep serving with no error, the killed
#     one's answer UNAVAILABLE through the proxy; once it is restarted on its store they
#     serve again with every acknowledged reward. The recovery time is printed;
#   - decisionctl move-problem moves a problem of 100k samples to another replica (a copy at
#     a snapshot, then the catch-up behind the fence) while a replay sends it traffic
#     through the proxy: the estimates are identical on both sides,
#     every acknowledged reward is on the new owner, the old one refuses the problem
#     naming it. The unavailability window is printed.
#
# Usage: tests/e2e_haproxy_test.sh DECISIOND DECISIONCTL SOURCE_DIR   (ctest passes them)
set -euo pipefail

source "$(dirname "$0")/e2e_common.sh" "$@"
command -v haproxy >/dev/null || fail "haproxy is not installed (deploy/install-deps.sh installs it)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/e2e_haproxy.XXXXXX")
declare -A PID
cleanup() {
  local rc=$?
  local name
  for name in "${!PID[@]}"; do kill "${PID[$name]}" 2>/dev/null || true; done
  for name in "${!PID[@]}"; do wait "${PID[$name]}" 2>/dev/null || true; done
  if ((rc != 0)); then
    for log in "$WORK"/*.err "$WORK"/haproxy.log; do
      [[ -s "$log" ]] || continue
      echo "--- last lines of $(basename "$log")" >&2
      tail -n 15 "$log" >&2
    done
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# A loopback port nothing answers on and not handed out before (a race with other
# processes is possible but rare). Sets FREE_PORT (a subshell could not remember).
TAKEN=" "
free_port() {
  local port
  while true; do
    port=$((20000 + RANDOM % 20000))
    [[ "$TAKEN" == *" $port "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      TAKEN+="$port "
      FREE_PORT=$port
      return
    fi
  done
}

MAP=$WORK/placement.map
cp "$ROOT/deploy/haproxy/placement.map" "$MAP"
printf 'home decisiond-0\nsearch decisiond-1\n' >>"$MAP"
REPLICAS=(decisiond-0 decisiond-1 decisiond-2)
declare -A PORT
for name in "${REPLICAS[@]}"; do free_port; PORT[$name]=$FREE_PORT; done

start_replica() {
  local name=$1
  "$DECISIOND" --listen="127.0.0.1:${PORT[$name]}" --metrics_listen= \
    --data_dir="$WORK/$name" --replica_id="$name" --placement_map="$MAP" \
    >"$WORK/$name.out" 2>>"$WORK/$name.err" &
  PID[$name]=$!
  local i
  for i in $(seq 1 100); do
    grep -q '^decisiond listening on ' "$WORK/$name.out" 2>/dev/null && return 0
    kill -0 "${PID[$name]}" 2>/dev/null || fail "$name exited at start"
    sleep 0.1
  done
  fail "$name did not start"
}

step "start three replicas and HAProxy with deploy/haproxy/haproxy.cfg"
for name in "${REPLICAS[@]}"; do start_replica "$name"; done
free_port; PROXY_PORT=$FREE_PORT
free_port; RUNTIME_PORT=$FREE_PORT
export HAPROXY_BIND=127.0.0.1:$PROXY_PORT HAPROXY_RUNTIME=127.0.0.1:$RUNTIME_PORT
export HAPROXY_MAP=$MAP
export DECISIOND_0=127.0.0.1:${PORT[decisiond-0]} DECISIOND_1=127.0.0.1:${PORT[decisiond-1]}
export DECISIOND_2=127.0.0.1:${PORT[decisiond-2]}
haproxy -c -q -f "$ROOT/deploy/haproxy/haproxy.cfg" || fail "haproxy -c rejects haproxy.cfg"
haproxy -db -f "$ROOT/deploy/haproxy/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
PID[haproxy]=$!
for i in $(seq 1 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$PROXY_PORT") 2>/dev/null && break
  sleep 0.1
done
ok "proxy on $HAPROXY_BIND, replicas on ${PORT[decisiond-0]}, ${PORT[decisiond-1]} and ${PORT[decisiond-2]}"

PROXY=(--server="127.0.0.1:$PROXY_PORT" --deadline_ms=3000)
via_proxy() { "$DECISIONCTL" "${PROXY[@]}" "$@"; }
on() { local name=$1; shift; "$DECISIONCTL" --server="127.0.0.1:${PORT[$name]}" --deadline_ms=3000 "$@"; }
holds() { on "$1" list-problems | awk 'NR > 1 {print $1}' | grep -qx "$2"; }

step "CreateProblem through the proxy lands on the placed owner"
for p in home search; do
  via_proxy create-problem "$p" --arms=3 --features=2 --wait_ms=600000 >/dev/null ||
    fail "create-problem $p through the proxy"
done
# Where PROBLEM is: the one replica that holds it (fails if none or several do).
owner_of() {
  local name found=""
  for name in "${REPLICAS[@]}"; do
    if holds "$name" "$1"; then
      [[ -z "$found" ]] || fail "$1 is on both $found and $name"
      found=$name
    fi
  done
  [[ -n "$found" ]] || fail "$1 is on no replica"
  echo "$found"
}
[[ $(owner_of home) == decisiond-0 ]] || fail "home is not on decisiond-0"
[[ $(owner_of search) == decisiond-1 ]] || fail "search is not on decisiond-1"
ok "home on decisiond-0, search on decisiond-1"

step "a problem not in the map goes to the consistent hash, and stays there"
via_proxy create-problem misc --arms=3 --features=2 >/dev/null || fail "create-problem misc"
misc_owner=$(owner_of misc)
for i in $(seq 1 10); do
  via_proxy choose misc --x=0.1,0.2 >/dev/null || fail "choose misc (call $i) through the proxy"
done
ok "misc on $misc_owner; 10 decisions through the proxy all reached it"

step "a replica refuses a problem placed on the other one, naming the owner"
if out=$(on decisiond-1 create-problem home --arms=3 --features=2 2>&1); then
  fail "decisiond-1 created home: $out"
fi
[[ "$out" == *"FAILED_PRECONDITION"*"problem home is placed on replica decisiond-0"* ]] ||
  fail "unexpected refusal: $out"
if out=$(on decisiond-1 choose home --x=0.1,0.2 2>&1); then fail "decisiond-1 served home"; fi
[[ "$out" == *"placed on replica decisiond-0"* ]] || fail "unexpected refusal: $out"
! holds decisiond-1 home || fail "decisiond-1 holds a copy of home"
ok "$out"

step "30 problems through the proxy: 6 placed, 24 hashed; each on one replica, every reward learned there"
for i in $(seq -w 0 29); do
  p=p$i
  if ((10#$i < 6)); then
    "$ROOT/deploy/haproxy/place.sh" "$p" "decisiond-$((10#$i % 3))" >/dev/null || fail "place.sh $p"
  fi
  via_proxy create-problem "$p" --arms=3 --features=2 --wait_ms=600000 >/dev/null ||
    fail "create-problem $p"
  for r in 1 2 3; do
    via_proxy choose "$p" --x=0.$r,0.$i --event_id="$p-$r" >/dev/null || fail "choose $p-$r"
    via_proxy reward "$p" "$p-$r" 1 >/dev/null || fail "reward $p-$r"
  done
done
declare -A SPREAD=([decisiond-0]=0 [decisiond-1]=0 [decisiond-2]=0)
declare -A OWNER
for i in $(seq -w 0 29); do
  p=p$i
  owner=$(owner_of "$p")
  OWNER[$p]=$owner
  if ((10#$i < 6)); then
    [[ "$owner" == "decisiond-$((10#$i % 3))" ]] || fail "$p is on $owner, placed on decisiond-$((10#$i % 3))"
  fi
  samples=$(on "$owner" estimates "$p" | awk 'NR == 1 {print $3}')
  ((samples == 3)) || fail "$p has $samples samples on its owner $owner; 3 rewards were sent"
  SPREAD[$owner]=$((SPREAD[$owner] + 1))
done
for name in "${REPLICAS[@]}"; do
  ((SPREAD[$name] > 0)) || fail "no problem landed on $name"
done
ok "problems per replica: decisiond-0 ${SPREAD[decisiond-0]}, decisiond-1 ${SPREAD[decisiond-1]}, decisiond-2 ${SPREAD[decisiond-2]}; 3 rewards learned for each"

step "place.sh moves the placement of a new problem at runtime"
"$ROOT/deploy/haproxy/place.sh" promo decisiond-1 "${PID[decisiond-0]}" "${PID[decisiond-1]}" "${PID[decisiond-2]}" >/dev/null ||
  fail "place.sh"
for name in "${REPLICAS[@]}"; do
  for i in $(seq 1 50); do
    grep -q 'SIGHUP: 9 problems placed' "$WORK/$name.err" && break
    sleep 0.1
  done
  grep -q 'SIGHUP: 9 problems placed' "$WORK/$name.err" || fail "$name did not reload the map"
done
via_proxy create-problem promo --arms=3 --features=2 >/dev/null || fail "create-problem promo"
[[ $(owner_of promo) == decisiond-1 ]] || fail "promo is not on decisiond-1"
grep -qx 'promo decisiond-1' "$MAP" || fail "the map file does not place promo"
ok "promo created on decisiond-1 through the same proxy process (pid ${PID[haproxy]})"

step "traffic on both replicas through the proxy; every reward acknowledged"
declare -A REWARDED=([home]=0 [search]=0)
for p in home search; do
  for i in $(seq 1 20); do
    via_proxy choose "$p" --x=0.$i,0.5 --event_id="$p-$i" >/dev/null || fail "choose $p-$i"
    via_proxy reward "$p" "$p-$i" 1 >/dev/null || fail "reward $p-$i"
    REWARDED[$p]=$((REWARDED[$p] + 1))
  done
done
ok "20 rewarded decisions each"

step "kill -9 decisiond-0: only its problems are affected (decisiond-1's and decisiond-2's serve)"
kill -9 "${PID[decisiond-0]}"
wait "${PID[decisiond-0]}" 2>/dev/null || true
unset 'PID[decisiond-0]'
KILLED_AT=$(date +%s.%N)
for i in $(seq 1 20); do
  via_proxy choose search --x=0.3,0.4 --event_id="search-after-$i" >/dev/null ||
    fail "search failed while decisiond-0 was down"
  via_proxy reward search "search-after-$i" 0 >/dev/null || fail "reward search-after-$i"
  REWARDED[search]=$((REWARDED[search] + 1))
done
via_proxy choose p02 --x=0.1,0.1 >/dev/null || fail "p02 (on decisiond-2) failed while decisiond-0 was down"
ok "search and p02: decisions and rewards, no error"
if out=$(via_proxy choose home --x=0.1,0.2 2>&1); then fail "home answered while its replica was down"; fi
[[ "$out" == *UNAVAILABLE* ]] || fail "home while down: $out"
ok "home: $out"

step "restart decisiond-0 on its store: its problems serve again with every acknowledged reward"
RESTARTED_AT=$(date +%s.%N)
start_replica decisiond-0
LISTENING_AT=$(date +%s.%N)
until via_proxy choose home --x=0.1,0.2 --event_id=home-back >/dev/null 2>&1; do
  (($(date +%s) - ${RESTARTED_AT%.*} < 30)) || fail "home did not come back within 30 s"
  sleep 0.05
done
SERVING_AT=$(date +%s.%N)
samples=$(via_proxy estimates home | awk 'NR == 1 {print $3}')
((samples == REWARDED[home])) || fail "home has $samples samples after the restart; ${REWARDED[home]} rewards were acknowledged"
samples=$(via_proxy estimates search | awk 'NR == 1 {print $3}')
((samples == REWARDED[search])) || fail "search has $samples samples; ${REWARDED[search]} rewards were acknowledged"
for p in "${!OWNER[@]}"; do
  [[ "${OWNER[$p]}" == decisiond-0 ]] || continue
  samples=$(via_proxy estimates "$p" | awk 'NR == 1 {print $3}')
  ((samples == 3)) || fail "$p has $samples samples after decisiond-0's restart; 3 were acknowledged"
done
ok "home: ${REWARDED[home]} samples kept; search: ${REWARDED[search]}; decisiond-0's ${SPREAD[decisiond-0]} of the 30: 3 each"
printf '   recovery: decisiond-0 listening %.2f s after its restart, serving home through the proxy %.2f s later\n' \
  "$(awk "BEGIN {print $LISTENING_AT - $RESTARTED_AT}")" "$(awk "BEGIN {print $SERVING_AT - $LISTENING_AT}")"
step "move a problem with 100k samples from decisiond-0 to decisiond-2 under live traffic"
REPLICA_PIDS=("${PID[decisiond-0]}" "${PID[decisiond-1]}" "${PID[decisiond-2]}")
"$ROOT/deploy/haproxy/place.sh" big decisiond-0 "${REPLICA_PIDS[@]}" >/dev/null || fail "place.sh big"
for name in "${REPLICAS[@]}"; do
  for i in $(seq 1 50); do
    grep -q 'SIGHUP: 10 problems placed' "$WORK/$name.err" && break
    sleep 0.1
  done
done
via_proxy create-problem big --arms=26 --features=16 --wait_ms=600000 >/dev/null ||
  fail "create-problem big"
LETTER=$ROOT/bench/data/letter.csv
REPLAY=(--deadline_ms=10000 --max_attempts=12 replay big --data="$LETTER")
for i in 1 2 3 4 5; do
  via_proxy "${REPLAY[@]}" >"$WORK/history$i.log" 2>&1 &
  PID[history$i]=$!
done
for i in 1 2 3 4 5; do
  wait "${PID[history$i]}" || fail "replay $i of big: $(tail -n 2 "$WORK/history$i.log")"
  unset "PID[history$i]"
done
history=$(via_proxy estimates big | awk 'NR == 1 {print $3}')
((history == 100000)) || fail "big has $history samples; 100000 rewards were acknowledged"
ok "big: $history samples on $(owner_of big)"
# The live traffic: a replay through the proxy that retries while the problem moves.
via_proxy "${REPLAY[@]}" --rounds=8000 >"$WORK/live.log" 2>&1 &
PID[live]=$!
until grep -q '^round 1000 ' "$WORK/live.log"; do
  kill -0 "${PID[live]}" 2>/dev/null || fail "the live replay ended early: $(tail -n 2 "$WORK/live.log")"
  sleep 0.05
done
PLACE="HAPROXY_MAP=$MAP HAPROXY_RUNTIME=$HAPROXY_RUNTIME $ROOT/deploy/haproxy/place.sh"
PLACE+=" \$DECISION_PROBLEM \$DECISION_REPLICA ${REPLICA_PIDS[*]} >/dev/null"
on decisiond-0 move-problem big --to="127.0.0.1:${PORT[decisiond-2]}" --to_replica=decisiond-2 \
  --place_cmd="$PLACE" >"$WORK/move.log" 2>&1 || fail "move-problem: $(cat "$WORK/move.log")"
grep -q '^estimates identical on both replicas (1[0-9]* samples)' "$WORK/move.log" ||
  fail "the estimates were not compared: $(cat "$WORK/move.log")"
wait "${PID[live]}" || fail "the live replay failed: $(tail -n 2 "$WORK/live.log")"
unset 'PID[live]'
grep -q '^round 8000 ' "$WORK/live.log" || fail "the live replay did not finish: $(tail -n 2 "$WORK/live.log")"
[[ $(owner_of big) == decisiond-2 ]] || fail "big is not on decisiond-2 after the move"
samples=$(via_proxy estimates big | awk 'NR == 1 {print $3}')
((samples == 108000)) || fail "big has $samples samples after the move; 108000 rewards were acknowledged"
if out=$(on decisiond-0 choose big --x=0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0 2>&1); then
  fail "decisiond-0 still serves big"
fi
[[ "$out" == *"FAILED_PRECONDITION"*"decisiond-2"* ]] || fail "decisiond-0 on big: $out"
ok "every one of the 108000 acknowledged rewards is on decisiond-2; decisiond-0 refuses big: $out"
sed -n 's/^/   /p' "$WORK/move.log"

echo "PASS"
