#!/usr/bin/env bash
# The main job: installs what is needed, builds, and runs decisiond on an embedded RocksDB
# under ./data, serving gRPC on 127.0.0.1:50051 and Prometheus metrics on 127.0.0.1:9464.
# Extra arguments go to decisiond (see `build/server/decisiond --help`), e.g.
#   deploy/run.sh --listen=0.0.0.0:50051 --sync_writes
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/build.sh
exec build/server/decisiond --data_dir=./data "$@"
