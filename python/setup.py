"""Builds the riffle daemon with Go into the wheel, beside the Python client.

The wheel is per platform (the binary is), for any Python 3: the client is
pure Python and talks to the daemon over a socket. Building needs Go and
the repository's Go sources one directory up (python/ is part of the
riffle repository); RIFFLE_GO names the go command.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


class BuildWithDaemon(build_py):
    def run(self):
        super().run()
        if not (REPO / "go.mod").exists():
            raise SystemExit(f"riffle's Go sources are not at {REPO}: build the wheel from the repository")
        go = find_go()
        out = Path(self.build_lib).resolve() / "riffle" / "bin" / "riffle"
        out.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED=os.environ.get("CGO_ENABLED", "1"))
        # A first build compiles the daemon and its modules for a few
        # minutes on two cores: say so, and show each package as it builds
        # (pip shows it with -v), instead of minutes of silence.
        print(f"riffle: building the daemon with {go} (a few minutes the first time; pip install -v shows each "
              "package)", file=sys.stderr, flush=True)
        # The fast JPEG path wherever libjpeg-turbo's headers are here.
        tags = subprocess.run([str(REPO / "scripts" / "go-tags")], capture_output=True, text=True).stdout.strip()
        subprocess.run([go, "build", "-v", "-trimpath", "-tags", tags, "-o", str(out), "./cmd/riffle"], cwd=REPO,
                       check=True, env=env)
        out.chmod(0o755)


def go_wants() -> str:
    """The Go version go.mod asks for."""
    for line in (REPO / "go.mod").read_text().splitlines():
        if line.startswith("go "):
            return line.split()[1]
    return "1.26"


def find_go() -> str:
    """The go command, checked: a clear message when it is missing or too old, not a raw Errno 2."""
    want = go_wants()
    go = os.environ.get("RIFFLE_GO") or shutil.which("go") or "/usr/local/go/bin/go"
    if not os.path.exists(go) and not shutil.which(go):
        raise SystemExit(f"riffle: building the daemon needs Go {want} or newer, and no go command was found "
                         "(install it from https://go.dev/dl, put it on PATH, or set RIFFLE_GO)")
    got = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True).stdout.strip().removeprefix("go")

    def parts(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v)[:3])
    if got and parts(got) < parts(want) and os.environ.get("GOTOOLCHAIN", "auto") == "local":
        raise SystemExit(f"riffle: building the daemon needs Go {want} or newer; {go} is Go {got} "
                         "(and GOTOOLCHAIN=local forbids fetching a newer one)")
    return go


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        return "py3", "none", plat


setup(cmdclass={"build_py": BuildWithDaemon, "bdist_wheel": PlatformWheel})
