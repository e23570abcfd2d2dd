#!/usr/bin/env bash
# Installs the dependencies (deploy/install-deps.sh) and builds everything in ./build
# (Release, Ninja, two parallel jobs: the reference machine has 2 cores).
# Usage: deploy/build.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "${JOBS:-2}"
