#!/usr/bin/env bash
# Installs every build, test and run dependency of the project from Debian 12 packages.
# Idempotent: it installs only what is missing, so it is cheap to run before every build.
# Used by the README's two commands, by .ci/run and by the Dockerfile: one source of truth.
#
# Usage: deploy/install-deps.sh [--runtime | --fuzz]
#   --runtime  only the shared libraries the decisiond binary needs (the Docker runtime stage)
#   --fuzz     the build packages and clang with libFuzzer (tests/fuzz/run.sh)
set -euo pipefail

build_packages=(
  build-essential cmake pkg-config ninja-build
  protobuf-compiler libprotobuf-dev
  libgrpc++-dev protobuf-compiler-grpc libssl-dev
  libabsl-dev
  librocksdb-dev
  prometheus-cpp-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev
  libxgboost-dev xgboost
  libjemalloc-dev
  gnuplot-nox
  curl ca-certificates
  prometheus jq
  haproxy
)
# The packages of every library decisiond and decisionctl link directly (readelf -d NEEDED,
# mapped with dpkg -S); the rest comes with them as Debian dependencies.
runtime_packages=(
  libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 librocksdb7.8
  libprometheus-cpp-pull1.0 libprometheus-cpp-core1.0 libxgboost0
  libsnappy1v5 liblz4-1 libzstd1 libbz2-1.0 zlib1g libssl3 libjemalloc2
)

# clang 14 and its runtimes (libFuzzer, ASan, UBSan), for the fuzz targets only.
fuzz_packages=(clang-14 libclang-rt-14-dev)

packages=("${build_packages[@]}")
if [[ "${1:-}" == "--runtime" ]]; then
  packages=("${runtime_packages[@]}")
elif [[ "${1:-}" == "--fuzz" ]]; then
  packages+=("${fuzz_packages[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=""
if [[ "$(id -u)" != "0" ]]; then
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
