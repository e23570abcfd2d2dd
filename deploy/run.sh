#!/usr/bin/env bash
# The main job: installs what is needed, builds, and runs decisiond on an embedded RocksDB
# under ./data, serving gRPC on 127.0.0.1:50051 and Prometheus metrics on 127.0.0.1:9464.
# Extra arguments go to decisiond (see `build/server/decisiond --help`), e.g.
#   deploy/run.sh --sync_writes --metrics_listen=127.0.0.1:9465
# (a non-loopback --listen also needs TLS and a tokens file: README.md, "Security")
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/build.sh
exec build/server/decisiond --data_dir=./data "$@"
