#!/usr/bin/env bash
# Real data for `riffle train`, offline: the heart_scale LIBSVM set that
# Debian's liblinear-tools ships (270 examples, 13 features), written sorted
# by label to data/heart_scale.sorted.svm, the order that hurts SGD most.
set -euo pipefail
cd "$(dirname "$0")/.."
src=/usr/share/doc/liblinear-tools/examples/heart_scale
if [ ! -e "$src" ] && [ ! -e "$src.gz" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends liblinear-tools >/dev/null
fi
mkdir -p data
{ if [ -e "$src" ]; then cat "$src"; else zcat "$src.gz"; fi; } | sort -s -n -k1,1 > data/heart_scale.sorted.svm
wc -l data/heart_scale.sorted.svm
