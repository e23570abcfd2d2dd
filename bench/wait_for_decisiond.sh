# Sourced by the bench scripts that start a decisiond in the background.
#
# wait_for_decisiond PID LOG CHECK...: runs CHECK (a `decisionctl health` call) until it
# succeeds. If decisiond (PID, writing its stderr to LOG) exits first, as it does on a bad
# flag or a missing model probe, prints LOG and returns 1 instead of polling forever.
wait_for_decisiond() {
  local pid=$1 log=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    # A child that exited is a zombie until waited: its /proc state tells.
    if [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" =~ ^(Z|)$ ]]; then
      echo "$(basename "$0"): decisiond exited:" >&2
      cat "$log" >&2
      return 1
    fi
    sleep 0.2
  done
}
