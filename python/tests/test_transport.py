"""The connection to the daemon: frames of any size arrive whole, a timeout holds whatever the daemon does, and a
value the daemon cannot decode is an InvalidSpec naming it, on a connection that goes on."""

from __future__ import annotations

import os
import resource
import signal
import socket
import struct
import threading
import time

import numpy as np
import pytest

import riffle
from riffle import client, wire

from conftest import Daemon, free_port, write_fixed


def long_named(root, n: int, width: int) -> str:
    """n files of one 16-byte record each (its file's number), every path at least width bytes; their glob."""
    root.mkdir()
    pad = max(1, width - len(str(root)) - len("/-00000.bin"))
    for i in range(n):
        (root / f"{'r' * pad}-{i:05d}.bin").write_bytes(b"%016d" % i)
    return str(root / "*.bin")


def test_a_glob_of_8000_long_paths_opens(daemon, tmp_path):
    # Its opened reply lists every path: over half a MiB, more than a socket's buffer.
    glob = long_named(tmp_path / "many", 8000, 65)
    ld = riffle.Loader(glob, batch_size=1000, record_size=16, seed=3, timeout=30)
    assert len(ld.info()["paths"]) == 8000
    got = sorted(int(bytes(b.record(i))) for b in ld for i in range(len(b)))
    assert got == list(range(8000))


def deep_named(root, n: int) -> tuple[str, list[str]]:
    """n files of one 16-byte record each in a directory ~3,600 bytes deep: their glob and their paths, a reply of
    every path over 16 MiB for 5,000 of them."""
    d = root
    for i in range(14):
        d = d / (f"{i:02d}" + "d" * 240)
    d.mkdir(parents=True)
    paths = []
    for i in range(n):
        p = d / (f"{i:05d}" + "f" * 95 + ".bin")
        p.write_bytes(b"%016d" % i)
        paths.append(str(p))
    return str(d / "*.bin"), paths


def test_a_reply_over_16_mib_arrives_and_a_request_over_it_is_refused(daemon, tmp_path):
    glob, paths = deep_named(tmp_path / "deep", 5000)
    # The daemon's reply lists every path: 18 MB, more than a request may be, which a client takes from its daemon.
    ld = riffle.Loader(glob, 1000, record_size=16, seed=1, timeout=60)
    assert len(ld.info()["paths"]) == 5000
    assert sorted(int(bytes(b.record(i))) for b in ld for i in range(len(b))) == list(range(5000))
    # Naming every path in the request is more than the daemon reads from a client: refused before it is sent, saying
    # what to do. (The daemon dropped the connection, and the client said it had died.)
    conn = client.connect()
    with pytest.raises(riffle.InvalidSpec, match="at most 16777216: name fewer or shorter paths"):
        riffle.Loader(paths, 1000, record_size=16)
    assert not conn.dead


class Stammerer:
    """A peer on a Unix socket that answers hello as a daemon does, then answers the next request with the start of
    a frame and one more byte every 0.2 s, for ever: what a client meets when a daemon's reply is cut."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _frame(self, c: socket.socket) -> dict:
        head = b""
        while len(head) < 4:
            head += c.recv(4 - len(head))
        (n,) = struct.unpack("<I", head)
        body = b""
        while len(body) < n:
            body += c.recv(n - len(body))
        return wire.decode(body)

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._answer, args=(c,), daemon=True).start()

    def _answer(self, c: socket.socket) -> None:
        try:
            hello = self._frame(c)
            c.sendall(wire.encode({"op": "hello", "tag": hello["tag"], "version": wire.VERSION}))
            req = self._frame(c)
            frame = wire.encode({"op": "opened", "tag": req["tag"], "records": 1, "info": {"paths": ["x" * 1000]}})
            c.sendall(frame[:100])
            for b in frame[100:]:
                if self.stop.wait(0.2):
                    return
                c.sendall(bytes([b]))
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        for c in self.conns:
            c.close()


def test_a_cut_reply_cannot_hold_the_client_past_its_timeout(tmp_path):
    (tmp_path / "run").mkdir(mode=0o700)
    path = str(tmp_path / "run" / "s.sock")
    peer = Stammerer(path)
    try:
        start = time.monotonic()
        with pytest.raises(riffle.DaemonGone, match="within 2s"):
            riffle.Loader(write_fixed(tmp_path / "d.bin", 10, 8), 10, record_size=8, socket=path, timeout=2, autostart=False)
        # The open is tried once more on a new connection; each has the timeout the user gave. (A byte every
        # 0.2 s held a client that waited its timeout between bytes for as long as the bytes came.)
        assert time.monotonic() - start < 30
    finally:
        peer.close()


def test_a_stopped_daemon_cannot_hold_an_open_past_the_timeout(tmp_path, monkeypatch):
    d = Daemon(str(tmp_path / "s.sock"))
    path = write_fixed(tmp_path / "d.bin", 100, 64)
    try:
        ld = riffle.Loader(path, 10, record_size=64, socket=d.sock, timeout=2, autostart=False, reconnect=0)
        os.kill(d.proc.pid, signal.SIGSTOP)
        while "T (stopped)" not in open(f"/proc/{d.proc.pid}/status").read():
            time.sleep(0.01)
        start = time.monotonic()
        with pytest.raises(riffle.DaemonGone, match="within 2s"):
            next(iter(ld))  # the job opens here: an open waited ten minutes whatever the user's timeout
        assert time.monotonic() - start < 30
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
        d.stop()


@pytest.mark.parametrize("option, value, says", [
    ("seed", -1, "seed: -1 is not an integer from 0 to 18446744073709551615"),
    ("seed", 2**64, "seed: 18446744073709551616 is not an integer"),
    ("world_size", "2", "world: a string is not an integer"),
    ("min_randomness", float("nan"), "min_randomness: nan is not a finite number"),
    ("depth", object(), "depth: object"),
])
def test_a_value_of_the_wrong_type_is_an_invalid_spec(daemon, fixed_file, option, value, says):
    # At construction, as the exception a PyTorch user catches; and the process's connection goes on.
    conn = client.connect()
    with pytest.raises(riffle.InvalidSpec, match=says) as e:
        riffle.Loader(fixed_file, 100, record_size=64, **{option: value})
    assert isinstance(e.value, ValueError)
    assert not conn.dead and client.connect() is conn
    ids = [i for b in riffle.Loader(fixed_file, 100, record_size=64, seed=np.int64(7)) for i in b.ids.tolist()]
    assert sorted(ids) == list(range(1000))


def daemon_fds(d: Daemon) -> int:
    return len(os.listdir(f"/proc/{d.proc.pid}/fd"))


def limit_fds(d: Daemon, n: int | None) -> None:
    """Set the daemon's limit on open descriptors (its soft limit, which is what the kernel checks; None: its hard
    limit)."""
    hard = resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE)[1]
    resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE, (hard if n is None else n, hard))


def test_idle_metrics_connections_leave_the_owner_served(tmp_path):
    # A daemon at a limit of 1,024 descriptors, and 1,012 idle keep-alive connections to its metrics port, which
    # needs no token: the owner's next job is served. (The daemon took them all and then exited, its socket's
    # accept failing for want of a descriptor.)
    port = free_port()
    d = Daemon(str(tmp_path / "s.sock"), "--metrics", f"127.0.0.1:{port}")
    idle = []
    try:
        limit_fds(d, 1024)  # as `ulimit -n 1024` would start it
        for _ in range(1012):
            c = socket.create_connection(("127.0.0.1", port))
            idle.append(c)
            try:
                c.sendall(b"GET /metrics HTTP/1.1\r\nHost: riffle\r\n\r\n")
            except OSError:
                pass  # refused: over the metrics connections' cap
        path = write_fixed(tmp_path / "d.bin", 1000, 64)
        ld = riffle.Loader(path, 100, record_size=64, socket=d.sock, autostart=False, reconnect=0)
        assert sorted(i for b in ld for i in b.ids.tolist()) == list(range(1000))
        assert d.proc.poll() is None
    finally:
        for c in idle:
            c.close()
        d.stop()


def test_a_daemon_out_of_descriptors_lives_and_says_so(tmp_path):
    d = Daemon(str(tmp_path / "s.sock"))
    glob = long_named(tmp_path / "many", 1200, 40)
    try:
        # A job over more files than the daemon may open: a clear error, not a data error, and the daemon lives.
        limit_fds(d, daemon_fds(d) + 100)
        with pytest.raises(riffle.RiffleError, match="file descriptors.*ulimit -n") as e:
            list(riffle.Loader(glob, 100, record_size=16, socket=d.sock, autostart=False, reconnect=0))
        assert not isinstance(e.value, riffle.DataError)
        limit_fds(d, None)
        # A job holding every descriptor the daemon may have: the next connection is told so, the daemon lives,
        # and once the job closes a connection is served again. (The socket's accept failed and ended the daemon.)
        ld = riffle.Loader(glob, 100, record_size=16, socket=d.sock, autostart=False, reconnect=0)
        it = iter(ld)
        next(it)
        limit_fds(d, daemon_fds(d))
        with pytest.raises(riffle.RiffleError, match="out of file descriptors"):
            client.Connection(d.sock, autostart=False, timeout=10)
        assert d.proc.poll() is None
        ld.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                assert d.stats().get("jobs", 0) == 0
                break
            except (riffle.RiffleError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        assert sorted(i for b in riffle.Loader(glob, 100, record_size=16, socket=d.sock, autostart=False)
                      for i in b.ids.tolist()) == list(range(1200))
    finally:
        d.stop()


def test_a_full_listen_queue_cannot_hold_a_connect_past_the_timeout(tmp_path):
    # A listener that takes no connection and queues none (a daemon stopped with its queue full): connect waits.
    (tmp_path / "run").mkdir(mode=0o700)
    path = str(tmp_path / "run" / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(0)
    queued = []
    try:
        for _ in range(2):  # fill the queue: the kernel takes one more than the backlog
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(path)
            except BlockingIOError:
                pass
            queued.append(s)
        start = time.monotonic()
        with pytest.raises(riffle.DaemonGone, match="did not take the connection within 2s"):
            client.Connection(path, timeout=2, autostart=False)
        assert time.monotonic() - start < 30
    finally:
        for s in queued:
            s.close()
        listener.close()
