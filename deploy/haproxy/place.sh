#!/usr/bin/env bash
# Places problem PROBLEM on replica REPLICA (a backend name of haproxy.cfg, and that
# replica's --replica_id), without dropping a connection:
#   1. the map file, rewritten atomically (HAProxy's next start, and the replicas' copy);
#   2. the running HAProxy, through its runtime API (`set map`, or `add map` for a new
#      problem): calls routed after this line go to REPLICA;
#   3. the replicas given as PIDS re-read the file (SIGHUP), so that they refuse calls for
#      problems placed elsewhere, naming the owner.
#
# Usage: HAPROXY_MAP=FILE HAPROXY_RUNTIME=HOST:PORT deploy/haproxy/place.sh PROBLEM REPLICA [PID...]
# (Kubernetes: run it where the map's ConfigMap is edited, against each HAProxy pod's
# runtime port, and `kubectl exec decisiond-N -- kill -HUP 1` for the replicas.)
set -euo pipefail
if (($# < 2)); then
  echo "usage: HAPROXY_MAP=FILE HAPROXY_RUNTIME=HOST:PORT $0 PROBLEM REPLICA [PID...]" >&2
  exit 2
fi
problem=$1
replica=$2
shift 2
: "${HAPROXY_MAP:?set HAPROXY_MAP to the placement map file}"
: "${HAPROXY_RUNTIME:?set HAPROXY_RUNTIME to HAProxy runtime API host:port}"
[[ "$problem" =~ ^[A-Za-z0-9._-]{1,64}$ ]] || { echo "place.sh: bad problem id '$problem'" >&2; exit 2; }
[[ "$replica" =~ ^[A-Za-z0-9._-]{1,64}$ ]] || { echo "place.sh: bad replica '$replica'" >&2; exit 2; }

# 1. The file: every line but this problem's, then its new line; renamed into place.
tmp=$(mktemp "${HAPROXY_MAP}.XXXXXX")
awk -v p="$problem" '$1 != p' "$HAPROXY_MAP" >"$tmp"
printf '%s %s\n' "$problem" "$replica" >>"$tmp"
chmod --reference="$HAPROXY_MAP" "$tmp" 2>/dev/null || true
mv "$tmp" "$HAPROXY_MAP"

# 2. The running proxy. The runtime API answers each command and closes the connection.
runtime() {
  local host=${HAPROXY_RUNTIME%:*} port=${HAPROXY_RUNTIME##*:}
  exec 3<>"/dev/tcp/$host/$port"
  printf '%s\n' "$1" >&3
  cat <&3
  exec 3<&-
}
answer=$(runtime "set map $HAPROXY_MAP $problem $replica")
if [[ -n "${answer//[[:space:]]/}" ]]; then  # "entry not found": a new problem
  answer=$(runtime "add map $HAPROXY_MAP $problem $replica")
  [[ -z "${answer//[[:space:]]/}" ]] || { echo "place.sh: HAProxy: $answer" >&2; exit 1; }
fi

# 3. The replicas.
for pid in "$@"; do kill -HUP "$pid"; done
echo "placed $problem on $replica"
