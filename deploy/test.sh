#!/usr/bin/env bash
# The test command: installs what is needed, builds, and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/build.sh
ctest --test-dir build --output-on-failure -j "${JOBS:-2}"
