#!/usr/bin/env bash
# Builds the platform wheel once, as projects with a compiled core ship
# theirs (`pip wheel ./python`: the build runs `go build` and puts the
# daemon in the wheel), then installs that wheel, with no Go in reach, into
# a fresh virtualenv on top of Debian's python3 (for its PyTorch), and runs
# tests against the installed package: not the source tree, not the
# repository's bin/riffle. The daemon in it needs nothing beyond the C
# library (test_installed.py reads its ldd).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# The README's `pip wheel -w dist ./python`, from the repository or from
# python/, leaves its wheels where git does not list them.
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  for d in dist python/dist; do
    git -C "$root" check-ignore -q "$d/riffle-0.2.0-py3-none-linux_x86_64.whl" ||
      { echo "git would list $d/ (.gitignore)" >&2; exit 1; }
  done
fi
dist=$(mktemp -d /tmp/riffle-wheel.XXXXXX)
venv=$(mktemp -d /tmp/riffle-installed.XXXXXX)
work=$(mktemp -d /tmp/riffle-installed-tests.XXXXXX)
trap 'rm -rf "$dist" "$venv" "$work"' EXIT
/usr/bin/python3 -m venv --system-site-packages "$venv"
# pip wheel at its default verbosity on a terminal (script gives it one), as
# a user runs pip install: the build says on the terminal, before the wait,
# how many packages it compiles (and how long a first build takes), though
# pip shows the build's own output only with -v; pip's log (--log, what
# -v shows) counts each package. A define no source reads, new each run,
# makes Go compile the cgo packages again: a short real build, so there is
# something to say even when Go's build cache holds the rest.
nonce="-DRIFFLE_TEST_INSTALLED_$$_$RANDOM"
script -qec "$(printf '%q ' env CGO_CFLAGS="-O2 -g $nonce" "$venv/bin/pip" wheel --disable-pip-version-check \
  --no-deps --log "$dist/pip.log" -w "$dist" "$root/python")" "$dist/terminal.log" </dev/null >/dev/null ||
  { cat "$dist/terminal.log" >&2; exit 1; }
grep -q 'riffle: compiling .* Go packages for the daemon' "$dist/terminal.log" ||
  { echo "the wheel's build said nothing on the terminal before compiling:" >&2; cat "$dist/terminal.log" >&2; exit 1; }
grep -q 'riffle: built the daemon, .* MB), in ' "$dist/terminal.log" ||
  { echo "the wheel's build did not say it was done:" >&2; cat "$dist/terminal.log" >&2; exit 1; }
grep -Eq '\[1/[0-9]+\] ' "$dist/pip.log" ||
  { echo "pip's log of the wheel's build counts no package" >&2; exit 1; }
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
