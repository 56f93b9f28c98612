#!/usr/bin/env bash
# Runs riffle's benchmarks on this machine and prints the tables that
# BENCHMARKS.md records. Cold runs drop the page cache (root only).
# Usage: bench/run.sh [DIR]   (DIR holds the 4 GiB test files; default /var/tmp/riffle-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/var/tmp/riffle-bench}
mkdir -p "$dir"
./scripts/install-deps.sh
go build -o bin/riffle ./cmd/riffle
r=bin/riffle
set -x
$r bench "$dir/r4k.bin" --create 4GiB --record-size 4096 --duration 10s
$r bench "$dir/r4k.bin" --record-size 4096 --duration 10s --mode cold --direct
$r bench "$dir/r128k.bin" --create 4GiB --record-size 131072 --duration 10s --mode cold
$r bench "$dir/r128k.bin" --record-size 131072 --duration 10s --mode cold --direct
/usr/bin/python3 bench/torch_bench.py --dir "$dir"
