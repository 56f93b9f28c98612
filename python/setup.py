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
        # The wheel's daemon is stripped of its symbol table and DWARF (-s -w: a quarter smaller; Go's own tables
        # still name each function and line in a panic's trace) and holds no path of this machine (-trimpath);
        # libjpeg-turbo is linked into it (scripts/go-tags, transform/decode_turbo.go), so it needs nothing
        # beyond the C library (scripts/test-installed.sh checks with ldd).
        env = dict(os.environ, GO=go, CGO_ENABLED=os.environ.get("CGO_ENABLED", "1"))
        build = [str(REPO / "scripts" / "build-daemon"), str(out), "-trimpath", "-ldflags=-s -w"]
        run_saying_why(build, env)
        out.chmod(0o755)


def run_saying_why(cmd: list[str], env: dict[str, str]) -> None:
    """Runs scripts/build-daemon, which says how many packages it compiles and how long a first build takes
    (minutes), then counts them. pip shows a build's output only with -v (and all of it when the build fails);
    without, it shows a spinner. So on a terminal its "riffle:" lines also go straight to the terminal, as a
    password prompt does: the user learns before the wait how long it is and why."""
    tty = None
    if not sys.stderr.isatty():  # else they reach the terminal anyway
        try:
            tty = open("/dev/tty", "w")
        except OSError:  # no terminal: CI, a log, nohup
            pass
    try:
        with subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, bufsize=1) as p:
            first = True
            for line in p.stdout:
                sys.stderr.write(line)
                sys.stderr.flush()
                if tty is not None and line.startswith("riffle: "):
                    # Below pip's "Building wheel for riffle ... " line, not at its end, and over the
                    # character pip's spinner left at the start of a line.
                    tty.write(("\n" if first else "\r") + line)
                    if line.startswith("riffle: compiling "):
                        tty.write("riffle: pip -v shows each package as it compiles\n")
                    tty.flush()
                    first = False
        if p.returncode != 0:
            raise SystemExit(f"riffle: building the daemon failed (exit status {p.returncode}): {' '.join(cmd)}")
    finally:
        if tty is not None:
            tty.close()


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
