"""Finding the daemon, and starting one: where its socket is, that its directory and the process answering are
this user's, the binary, and the token of a daemon over TCP.

If no daemon answers at the socket, the client starts one and later clients
on the machine share it. The socket's directory must belong to this user
with mode 0700, and the daemon answering must run as this user: otherwise
someone else could stand in for the daemon.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import struct
import subprocess
import time
from pathlib import Path

from .errors import RiffleError, UnsafeSocket


def default_socket() -> str:
    """Where the daemon listens: $RIFFLE_SOCKET, $XDG_RUNTIME_DIR/riffle.sock or /tmp/riffle-UID/riffle.sock."""
    if os.environ.get("RIFFLE_SOCKET"):
        return os.environ["RIFFLE_SOCKET"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "riffle.sock")
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", f"riffle-{os.getuid()}", "riffle.sock")


def private_dir(path: str, create: bool) -> None:
    """Check that ``path`` is a directory of this user's that no one else may enter (mode 0700), making it if asked."""
    if create:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as e:
            raise UnsafeSocket(f"cannot make the socket directory {path}: {e}") from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeSocket(f"the socket directory {path} is not a directory")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise UnsafeSocket(f"the socket directory {path} belongs to uid {st.st_uid} with mode {st.st_mode & 0o777:04o}; "
                           f"riffle needs one of uid {os.geteuid()} with mode 0700 (remove it, or set RIFFLE_SOCKET)")


def find_binary() -> str:
    """The riffle binary: $RIFFLE_BIN, the one installed with this package, ``riffle`` on PATH, or this repository's bin/riffle (built if need be)."""
    env = os.environ.get("RIFFLE_BIN")
    if env:
        return env
    bundled = Path(__file__).resolve().parent / "bin" / "riffle"
    if bundled.exists():
        return str(bundled)
    found = shutil.which("riffle")
    if found and not found.endswith(".py"):
        return found
    repo = Path(__file__).resolve().parents[2]
    built = repo / "bin" / "riffle"
    build = repo / "scripts" / "build-daemon"
    if not built.exists() and (repo / "go.mod").exists() and build.exists():
        # The project's one way to build the daemon (make build, the wheel): with the build tags this machine
        # takes (libjpeg-turbo's decoder where it is installed), which a plain go build would leave out.
        done = subprocess.run([str(build), str(built)], cwd=repo)
        if done.returncode != 0:
            raise RiffleError(f"building the daemon with {build} failed (status {done.returncode}; it said why above): "
                              "set RIFFLE_BIN, put riffle on PATH, or fix the build and run `make build`")
    if built.exists():
        return str(built)
    raise RiffleError("riffle binary not found: set RIFFLE_BIN, put riffle on PATH, or run `make build`")


def start_daemon(sock_path: str, timeout: float = 30.0, idle_exit: str = "300s") -> None:
    """Start a daemon on ``sock_path`` and wait until it answers.

    A daemon that exits before it answers fails this at once, with its exit status and the last lines it logged,
    unless another daemon answers there by then (two clients starting one at once: the second exits)."""
    d = os.path.dirname(sock_path)
    private_dir(d, create=True)
    log_path = sock_path + ".log"
    log = open(log_path, "ab")  # inside the private directory checked above
    logged = log.tell()  # the log is the socket's across daemons: this one's lines start here
    proc = subprocess.Popen(
        [find_binary(), "serve", "--socket", sock_path, "--idle-exit", idle_exit, "--quiet"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True,
    )
    log.close()
    if wait_for_socket(sock_path, timeout, proc):
        return
    status = proc.poll()
    if status is None:
        raise RiffleError(f"the riffle daemon did not start on {sock_path} within {timeout}s (see {log_path})")
    raise RiffleError(f"the riffle daemon exited with status {status} before it answered on {sock_path}; "
                      f"its log ({log_path}) ends:\n{_log_tail(log_path, logged)}")


def _log_tail(path: str, start: int, lines: int = 20) -> str:
    """The last lines written to the log at ``path`` from byte ``start`` on."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"(unreadable: {e})"
    return "\n".join(text.strip().splitlines()[-lines:]) or "(nothing)"


def wait_for_socket(path: str, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    """Wait until something accepts connections at the Unix socket ``path``; with ``proc``, the daemon started to
    listen there, only while it runs (then one last try: another may have answered in its place)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited = proc is not None and proc.poll() is not None
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return True
        except OSError:
            if exited:
                return False
            time.sleep(0.02)
        finally:
            s.close()
    return False


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _token_for(address: str) -> str:
    """The token for a TCP daemon: $RIFFLE_TOKEN, or the one the local daemon wrote next to its socket."""
    if os.environ.get("RIFFLE_TOKEN"):
        return os.environ["RIFFLE_TOKEN"]
    path = default_socket() + ".token"
    try:
        private_dir(os.path.dirname(path), create=False)
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnsafeSocket):
        return ""
