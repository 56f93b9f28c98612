"""Fixtures: a real riffle daemon on a temporary socket, and test datasets
whose records carry their own id."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

import riffle  # noqa: E402
from riffle import client  # noqa: E402


def riffle_bin() -> str:
    b = os.environ.get("RIFFLE_BIN")
    if b:
        return b
    out = REPO / "bin" / "riffle"
    # The project's one way to build the daemon (make build's, the wheel's).
    subprocess.run([str(REPO / "scripts" / "build-daemon"), str(out)], cwd=REPO, check=True)
    return str(out)


def status(sock: str) -> dict:
    """The daemon's status (riffle status)."""
    c = client.Connection(sock, autostart=False)
    try:
        return c.request({"op": "status"})[0]["status"]
    finally:
        c.close()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class MemoryCgroup:
    """A memory cgroup (v1) of its own, limited to ``limit`` bytes, for a daemon started in it (``Daemon(cgroup=)``).
    Needs root and a v1 memory hierarchy at /sys/fs/cgroup/memory."""

    ROOT = Path("/sys/fs/cgroup/memory")

    @classmethod
    def available(cls) -> bool:
        return os.geteuid() == 0 and (cls.ROOT / "memory.limit_in_bytes").exists()

    def __init__(self, name: str, limit: int):
        self.path = self.ROOT / f"{name}-{os.getpid()}"
        self.path.mkdir(exist_ok=True)
        (self.path / "memory.limit_in_bytes").write_text(str(limit))
        (self.path / "memory.max_usage_in_bytes").write_text("0")
        self.oom_kills_before = self.oom_kills()

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def oom_kills(self) -> int:
        """Processes of the cgroup the kernel's OOM killer ended (memory.oom_control's oom_kill)."""
        for line in self._read("memory.oom_control").splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return 0

    def peak(self) -> int:
        """The most memory the cgroup was charged (memory.max_usage_in_bytes)."""
        return int(self._read("memory.max_usage_in_bytes"))

    def failcnt(self) -> int:
        """How often a charge hit the limit (and the kernel reclaimed, page cache first)."""
        return int(self._read("memory.failcnt"))

    def remove(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


class Daemon:
    def __init__(self, sock: str, *args: str, cgroup: MemoryCgroup | None = None):
        self.sock = sock
        self.log = open(sock + ".log", "wb")
        cmd = [riffle_bin(), "serve", "--socket", sock, *args]
        if cgroup is not None:
            # Into the cgroup before it allocates anything: the daemon sizes
            # its budget from the limit it finds at start.
            cmd = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup.path / "cgroup.procs"), *cmd]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        if not client.wait_for_socket(sock, 20.0):
            raise RuntimeError(f"no daemon on {sock}")

    def stats(self) -> dict:
        c = client.Connection(self.sock, autostart=False)
        try:
            return c.request({"op": "stats"})[0]
        finally:
            c.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def versitygw() -> str:
    for p in (shutil.which("versitygw"), os.path.expanduser("~/go/bin/versitygw")):
        if p and os.path.exists(p):
            return p
    raise RuntimeError("versitygw is not installed (scripts/install-deps.sh installs it)")


class S3Server:
    """A real S3-compatible server (versitygw) on loopback over a POSIX back end in root: bucket ``bkt`` is the
    directory root/bkt, so a test writes an object as a file there. ``env`` is what a daemon needs to reach it."""

    def __init__(self, root: Path):
        self.root, self.bucket = root, root / "bkt"
        self.bucket.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.proc = subprocess.Popen([versitygw(), "--access", "ak", "--secret", "sk", "--port", f"127.0.0.1:{port}",
                                      "posix", str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"versitygw did not listen on 127.0.0.1:{port}")
                time.sleep(0.05)
        self.env = {"AWS_ACCESS_KEY_ID": "ak", "AWS_SECRET_ACCESS_KEY": "sk", "AWS_REGION": "us-east-1",
                    "RIFFLE_S3_ENDPOINT": f"http://127.0.0.1:{port}"}

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="session")
def bin_path() -> str:
    return riffle_bin()


@pytest.fixture(scope="session")
def daemon(tmp_path_factory, bin_path):
    d = Daemon(str(tmp_path_factory.mktemp("sock") / "riffle.sock"))
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def use_daemon(request, monkeypatch):
    # Tests talk to the session daemon unless they start their own.
    if "daemon" in request.fixturenames:
        monkeypatch.setenv("RIFFLE_SOCKET", request.getfixturevalue("daemon").sock)
    monkeypatch.setenv("RIFFLE_BIN", riffle_bin())


def record(i: int, size: int) -> bytes:
    """Record i: its id as a little-endian uint64, then bytes that depend on id and position."""
    body = ((np.arange(size - 8, dtype=np.uint32) * 31 + i * 7) % 251).astype(np.uint8).tobytes()
    return struct.pack("<Q", i) + body


def tfrecord_frames(records: list[bytes]) -> bytes:
    """TFRecord framing (TensorFlow's record_writer.cc): a length, its masked
    CRC32C, the record, the record's masked CRC32C. Computed here because
    TensorFlow is not in the test environment."""
    def crc32c(b: bytes) -> int:
        c = 0xFFFFFFFF
        for x in b:
            c ^= x
            for _ in range(8):
                c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
        return c ^ 0xFFFFFFFF

    def masked(b: bytes) -> int:
        c = crc32c(b)
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    out = []
    for r in records:
        n = struct.pack("<Q", len(r))
        out += [n, struct.pack("<I", masked(n)), r, struct.pack("<I", masked(r))]
    return b"".join(out)


def epoch_records(ld) -> dict[int, bytes]:
    """One epoch of a loader, each record's bytes by id; a record twice fails."""
    out: dict[int, bytes] = {}
    for b in ld:
        for k, i in enumerate(b.ids):
            assert int(i) not in out, f"record {i} twice in an epoch"
            out[int(i)] = bytes(b.record(k))
    return out


def write_fixed(path: Path, n: int, size: int) -> Path:
    with open(path, "wb") as f:
        for i in range(n):
            f.write(record(i, size))
    return path


@pytest.fixture
def fixed_file(tmp_path) -> Path:
    return write_fixed(tmp_path / "records.bin", 1000, 64)
