"""Builds the riffle daemon with Go into the wheel, beside the Python client.

The wheel is per platform (the binary is), for any Python 3: the client is
pure Python and talks to the daemon over a socket. Building needs Go and
the repository's Go sources one directory up (python/ is part of the
riffle repository); RIFFLE_GO names the go command.
"""

import os
import shutil
import subprocess
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
        go = os.environ.get("RIFFLE_GO") or shutil.which("go") or "/usr/local/go/bin/go"
        out = Path(self.build_lib).resolve() / "riffle" / "bin" / "riffle"
        out.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED=os.environ.get("CGO_ENABLED", "1"))
        subprocess.run([go, "build", "-trimpath", "-o", str(out), "./cmd/riffle"], cwd=REPO, check=True, env=env)
        out.chmod(0o755)


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        return "py3", "none", plat


setup(cmdclass={"build_py": BuildWithDaemon, "bdist_wheel": PlatformWheel})
