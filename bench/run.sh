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
# Block-aware shuffles against the record-level one and a sequential read (issue 6).
for rs in 256 1024 4096; do
  $r bench "$dir/r4k.bin" --record-size $rs --duration 10s --mode cold --no-fio --sampler global,block --block-size 65536
  $r bench "$dir/r4k.bin" --record-size $rs --duration 10s --mode cold --no-fio --sampler block --block-size 65536 --direct
done
$r train --synthetic 20000 --buffer 64
./scripts/heart-scale.sh && $r train data/heart_scale.sorted.svm --batch-size 16 --block-size 512 --buffer 16 --lr 0.1
$r quality --records 100000 --record-size 256 --sampler global,block,buffered,reservoir,sequential --svg bench/orders.svg
$r quality --records 100000 --record-size 256 --sampler block --window 8
# Jobs in one memory cgroup (issue 17) and jobs sharing reads (issue 12).
/usr/bin/python3 bench/jobs.py
/usr/bin/python3 bench/share.py --parts speeds,overlap,decode,joader
# Formats (issue 13), converting once (issue 14).
.venv/bin/python bench/formats.py --parts hf,parquet,wds
.venv/bin/python bench/pack.py --parts jpeg,packed
# Object storage, the disk tier and many nodes (issue 15).
go test ./bench -run '^$' -bench S3 -benchtime 1x
go test ./storage/tier -run '^$' -bench TierPolicies -benchtime 1x
.venv/bin/python bench/nodes.py
# Token corpora against Megatron's GPTDataset and nanoGPT's get_batch (issue 48).
.venv/bin/python bench/tokens.py --dir /tmp/riffle-tokens --repeats 3
# The peers' table (issue 16).
./bench/peers/setup.sh
.venv/bin/python bench/peers/harness.py
