#!/usr/bin/env bash
# Installs what riffle's tests and benchmarks need from Debian's packages,
# only when something is missing: real PyTorch, torchvision, numpy and
# Pillow for the Python client's tests and examples, scikit-learn as an
# independent LIBSVM reader, PyYAML for the test of docs/nodes.md's
# manifests, pytest to run them, fio for the benchmarks'
# device ceiling, chromium for the test of the daemon's live view in a
# real headless browser (server/view_browser_test.go); then a virtualenv
# (.venv, on top of those) with the pinned PyPI packages the tests use as
# independent writers and readers (pyarrow, datasets, webdataset:
# python/requirements-test.txt).
set -euo pipefail
need=()
/usr/bin/python3 -c 'import torch' 2>/dev/null || need+=(python3-torch)
/usr/bin/python3 -c 'import numpy' 2>/dev/null || need+=(python3-numpy)
/usr/bin/python3 -c 'import pytest' 2>/dev/null || need+=(python3-pytest)
/usr/bin/python3 -c 'import PIL' 2>/dev/null || need+=(python3-pil)
/usr/bin/python3 -c 'import torchvision' 2>/dev/null || need+=(python3-torchvision)
/usr/bin/python3 -c 'import sklearn' 2>/dev/null || need+=(python3-sklearn)
/usr/bin/python3 -c 'import yaml' 2>/dev/null || need+=(python3-yaml)
command -v fio >/dev/null || need+=(fio)
command -v chromium >/dev/null || need+=(chromium)
grep -qs jpeg_crop_scanline /usr/include/jpeglib.h || need+=(libjpeg62-turbo-dev)
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The virtualenv, remade when the pins change.
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/python/requirements-test.txt"
nodeps="$root/python/requirements-nodeps.txt"
venv="$root/.venv"
stamp="$venv/.requirements"
if ! cat "$req" "$nodeps" | cmp -s - "$stamp" 2>/dev/null; then
  echo "making $venv from $req" >&2
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$nodeps"
  cat "$req" "$nodeps" > "$stamp"
fi

# A real S3-compatible server for the object-storage tests and benchmarks
# (internal/s3test starts it on loopback), pinned.
gobin=$(/usr/local/go/bin/go env GOPATH 2>/dev/null || go env GOPATH)/bin
if [ ! -x "$gobin/versitygw" ] && ! command -v versitygw >/dev/null; then
  echo "installing versitygw" >&2
  PATH="/usr/local/go/bin:$PATH" go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
fi

# apache-arrow's JavaScript writer, an independent writer of Arrow IPC
# files for the tests (scripts/js/package.json pins it; npm ci follows the
# lockfile), installed when the pin changes.
js="$root/scripts/js"
if command -v npm >/dev/null && ! cmp -s "$js/package-lock.json" "$js/node_modules/.riffle-lock" 2>/dev/null; then
  echo "installing the JavaScript test writers" >&2
  (cd "$js" && npm ci --no-audit --no-fund --silent && cp package-lock.json node_modules/.riffle-lock)
fi
