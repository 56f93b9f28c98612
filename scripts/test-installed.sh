#!/usr/bin/env bash
# Builds the platform wheel once, as projects with a compiled core ship
# theirs (`pip wheel ./python`: the build runs `go build` and puts the
# daemon in the wheel), then installs that wheel, with no Go in reach, into
# a fresh virtualenv on top of Debian's python3 (for its PyTorch), and runs
# tests against the installed package: not the source tree, not the
# repository's bin/riffle.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dist=$(mktemp -d /tmp/riffle-wheel.XXXXXX)
venv=$(mktemp -d /tmp/riffle-installed.XXXXXX)
work=$(mktemp -d /tmp/riffle-installed-tests.XXXXXX)
trap 'rm -rf "$dist" "$venv" "$work"' EXIT
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" wheel -q --disable-pip-version-check --no-deps -w "$dist" "$root/python"
wheel=$(ls "$dist"/riffle-*.whl)
case "$wheel" in
  *-py3-none-linux_*.whl) ;;
  *) echo "not a platform wheel: $wheel" >&2; exit 1 ;;
esac
# Install with a PATH that holds no go command: the wheel carries the daemon.
nogo=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '/go/bin' -e '^$' | paste -sd:)
env PATH="$nogo" RIFFLE_GO=/nonexistent/go "$venv/bin/pip" install -q --disable-pip-version-check "$wheel"
[ -x "$venv/bin/riffle" ] || { echo "the wheel put no riffle on PATH" >&2; exit 1; }
"$venv/bin/riffle" --version >/dev/null
# Run from outside the repository, with neither the source tree nor its
# binary nor Go in reach: the package finds its own daemon.
cp "$root/python/tests_installed/test_installed.py" "$work/"
cd "$work"
env -u RIFFLE_BIN -u PYTHONPATH -u RIFFLE_SOCKET PATH="$venv/bin:$nogo" \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider test_installed.py
