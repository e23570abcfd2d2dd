#!/usr/bin/env bash
# decisionctl against a real decisiond: bad input fails with a message and an exit code,
# before anything is sent or stored where it can be checked first.
#   - a token or a problem id with a byte gRPC cannot put in a header (a trailing newline)
#     is refused or stripped; gRPC would abort the process (exit 134);
#   - register-expert --linear refuses rows of different lengths, naming the row, and a
#     model file's bad number names its file and line;
#   - export --format=csv quotes an event id with a comma or a quote (RFC 4180), and a write
#     that fails (a full disk) fails the command;
#   - replay checks every row against the problem before its first decision: labels that
#     are no arm, rows of the wrong width, a file without a header, a curve file it cannot
#     write, a missing --data;
#   - --help lists the commands with their arguments.
set -euo pipefail
source "$(dirname "$0")/e2e_common.sh"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/e2e_decisionctl.XXXXXX")
DECISIOND_PID=
cleanup() {
  local rc=$?
  if [[ -n "$DECISIOND_PID" ]]; then
    kill "$DECISIOND_PID" 2>/dev/null || true
    wait "$DECISIOND_PID" 2>/dev/null || true
  fi
  if ((rc != 0)) && [[ -s "$WORK/decisiond.err" ]]; then
    echo "--- last lines of decisiond.err" >&2
    tail -n 20 "$WORK/decisiond.err" >&2
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

"$DECISIOND" --listen=127.0.0.1:0 --metrics_listen= --data_dir="$WORK/data" --seed=1 \
  >"$WORK/decisiond.out" 2>"$WORK/decisiond.err" &
DECISIOND_PID=$!
for _ in $(seq 200); do
  grep -q '^decisiond listening on ' "$WORK/decisiond.out" && break
  kill -0 "$DECISIOND_PID" 2>/dev/null || fail "decisiond exited at start"
  sleep 0.05
done
read -r _ _ _ ADDRESS _ < <(grep -m1 '^decisiond listening on ' "$WORK/decisiond.out") ||
  fail "decisiond did not print its address"
C=("$DECISIONCTL" --server="$ADDRESS")

# Runs "${C[@]}" "$@", keeping its output in $OUT and its exit code in $RC.
run() {
  set +e
  OUT=$("${C[@]}" "$@" 2>&1)
  RC=$?
  set -e
}
expect() {  # expect RC SUBSTRING WHAT
  [[ $RC == "$1" ]] || fail "$3: exit $RC, not $1: $OUT"
  [[ "$OUT" == *"$2"* ]] || fail "$3: the output does not say '$2': $OUT"
  ok "$3"
}

"${C[@]}" create-problem p --arms=3 --features=2 --wait_ms=600000 >/dev/null

step "bytes a header cannot carry"
set +e
OUT=$(DECISION_TOKEN=$'s3cret\n' "${C[@]}" list-problems 2>&1)
RC=$?
set -e
expect 0 "p" "a token from the environment with a trailing newline is stripped"
run choose $'p\n' --x=1,2
expect 1 "INVALID_ARGUMENT" "a problem id with a newline is refused by the server, not abort"

run choose p --x=1,,2
expect 2 "an empty cell in \`1,,2\`" "an empty cell is refused, not skipped (it would shift the features)"

step "model files"
printf '0 1 0 5\n0 0\n0 -1 -1\n' >"$WORK/ragged.txt"
run register-expert p --name=ragged --linear="$WORK/ragged.txt"
expect 2 "row 2 has 2 numbers, the first row 4" "ragged --linear rows are refused"
printf '0 1 0\n0 x 1\n' >"$WORK/nan.txt"
run register-expert p --name=bad --linear="$WORK/nan.txt"
expect 2 "nan.txt: line 2: " "a bad number names its file and line"
run list-experts p
[[ "$OUT" != *ragged* && "$OUT" != *bad* ]] || fail "a refused model was registered: $OUT"
ok "nothing was registered"

step "export"
"${C[@]}" choose p --x=0.5,0.2 --event_id='a,b"c' >/dev/null
"${C[@]}" reward p 'a,b"c' 1 >/dev/null
"${C[@]}" export p --format=csv >"$WORK/log.csv"
python3 - "$WORK/log.csv" <<'EOF' || fail "the CSV export does not parse as 12-column rows"
import csv, sys
rows = list(csv.reader(open(sys.argv[1], newline="")))
assert len(rows) == 2 and all(len(r) == 12 for r in rows), rows
assert rows[1][1] == 'a,b"c', rows[1]
EOF
ok "an event id with a comma and a quote is one quoted field"
if [[ -w /dev/full ]]; then
  run export p --format=jsonl --output=/dev/full
  expect 1 "cannot write /dev/full" "a write that fails fails the export"
fi

step "replay checks its input before the first decision"
PROBLEMS=$("${C[@]}" list-problems)
printf 'x0,x1,label\n0.1,0.2,1\n0.3,0.4,7\n' >"$WORK/label.csv"
run replay p --data="$WORK/label.csv"
expect 1 "line 3: label 7 is not an arm of problem p (0 to 2)" "a label that is no arm"
printf 'x0,x1,label\n0.1,0.2,0.5,1\n' >"$WORK/wide.csv"
run replay p --data="$WORK/wide.csv"
expect 1 "4 columns; problem p has 2 features, then the label" "a row of the wrong width"
printf '0.1,0.2,1\n0.3,0.4,2\n' >"$WORK/noheader.csv"
run replay p --data="$WORK/noheader.csv"
expect 1 "the CSV needs a header line" "a file without a header"
printf 'x0,x1,label\n0.1,0.2,1\n' >"$WORK/good.csv"
run replay p --data="$WORK/good.csv" --curve_csv="$WORK/no/such/dir/curve.csv"
expect 1 "cannot write $WORK/no/such/dir/curve.csv" "a curve file it cannot write"
run replay p
expect 2 "replay needs --data" "a missing --data"
[[ "$("${C[@]}" list-problems)" == "$PROBLEMS" ]] ||
  fail "a refused replay made decisions"
ok "no refused replay made a decision"
run replay p --data="$WORK/good.csv"
expect 0 "round 1 progressive loss" "a good file replays"

step "--help"
run --help
[[ "$OUT" == *"replay PROBLEM --data=CSV"* && "$OUT" == *"end-move PROBLEM"* ]] ||
  fail "--help does not list the commands: $OUT"
ok "--help lists the commands with their arguments"
