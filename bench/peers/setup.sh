#!/usr/bin/env bash
# Makes the pinned environments the peer loaders run in, under
# bench/peers/.venvs (only when a requirements file changed): one on top of
# Debian's python3 and its PyTorch 1.13 for the PyTorch loaders, and one of
# its own for each of tf.data, Grain and Ray Data, whose pins want numpy 2.
# Everything comes from the package registry; nothing is fetched when the
# benchmark runs. With names (`setup.sh torch grain`), only those.
set -euo pipefail
only=" $* "
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
"$root/scripts/install-deps.sh"
mk() { # name, system-site-packages (yes/no), requirements files...
  local name=$1 sys=$2; shift 2
  if [ "$only" != "  " ] && [[ "$only" != *" $name "* ]]; then return; fi
  local v="$here/.venvs/$name" stamp="$here/.venvs/$name/.requirements"
  if cat "$@" | cmp -s - "$stamp" 2>/dev/null; then return; fi
  echo "making $v" >&2
  rm -rf "$v"
  if [ "$sys" = yes ]; then
    /usr/bin/python3 -m venv --system-site-packages "$v"
  else
    /usr/bin/python3 -m venv "$v"
  fi
  "$v/bin/pip" install -q --disable-pip-version-check -r "$1"
  if [ "$name" = torch ]; then
    "$v/bin/pip" install -q --disable-pip-version-check --no-deps -r "$here/requirements-torch-nodeps.txt"
  fi
  cat "$@" > "$stamp"
}
mk torch yes "$here/requirements-torch.txt" "$here/requirements-torch-nodeps.txt"
mk tf no "$here/requirements-tf.txt"
mk grain no "$here/requirements-grain.txt"
mk ray no "$here/requirements-ray.txt"
