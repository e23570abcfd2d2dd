# Sourced by the end-to-end scripts (tests/e2e_*_test.sh), with their arguments: checks
# them (DECISIOND DECISIONCTL SOURCE_DIR, as ctest passes them), sets DECISIOND,
# DECISIONCTL and ROOT, and defines the scripts' output: step, ok, fail (exits 1).
if (($# != 3)); then
  echo "usage: $0 DECISIOND DECISIONCTL SOURCE_DIR" >&2
  exit 2
fi
DECISIOND=$1
DECISIONCTL=$2
ROOT=$3

step() { echo "== $*"; }
ok() { echo "   ok: $*"; }
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
