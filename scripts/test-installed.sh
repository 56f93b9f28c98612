#!/usr/bin/env bash
# Installs the Python package with pip, as a user would (`pip install
# ./python`: the build runs `go build` and puts the daemon in the wheel),
# into a fresh virtualenv on top of Debian's python3 (for its PyTorch), and
# runs tests against the installed package: not the source tree, not the
# repository's bin/riffle.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(mktemp -d /tmp/riffle-installed.XXXXXX)
trap 'rm -rf "$venv"' EXIT
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "$root/python"
[ -x "$venv/bin/riffle" ] || { echo "pip install put no riffle on PATH" >&2; exit 1; }
"$venv/bin/riffle" --version >/dev/null
# Run from outside the repository, with neither the source tree nor its
# binary in reach: the package finds its own daemon.
work=$(mktemp -d /tmp/riffle-installed-tests.XXXXXX)
trap 'rm -rf "$venv" "$work"' EXIT
cp "$root/python/tests_installed/test_installed.py" "$work/"
cd "$work"
env -u RIFFLE_BIN -u PYTHONPATH -u RIFFLE_SOCKET PATH="$venv/bin:$PATH" \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider test_installed.py
