#!/usr/bin/env bash
# Builds the two GPU binaries with CUDA, strips them and copies them into
# DIR (default .devbin-main; .gitignore ignores /.devbin*/) for the
# device tool's `carry`. They live in two packages: `--bins` at the root
# builds `mxswitch` only, so `gpu_check` needs its own build (a stale one
# measures old code).
#
#   bash bench/build_devbin.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-.devbin-main}
cargo build --release --features cuda --bins
cargo build --release -p mxswitch-runtime --features cuda --bin gpu_check
rm -rf "$D"
mkdir -p "$D"
cp target/release/mxswitch target/release/gpu_check "$D/"
strip "$D"/*
ls -la "$D"
