"""One connection to the daemon, and the connections a process shares (one per thread and daemon)."""

from __future__ import annotations

import array
import collections
import os
import select
import socket
import threading
import time
from typing import Any, Sequence

from . import wire
from .daemon import _peer_uid, _token_for, default_socket, private_dir, start_daemon
from .errors import DaemonGone, InvalidSpec, RiffleError, UnsafeSocket, error_from


# Seconds a reply may take by default: any request's, and an open's, which may build an index or wait for memory.
DEFAULT_TIMEOUT = 60.0
OPEN_TIMEOUT = 600.0


class Connection:
    """One connection to the daemon, used by one thread at a time.

    Every request carries a tag that its reply echoes: replies to requests
    of different jobs may come back in another order than they were sent.
    Releases of batches the user dropped are queued by finalizers (from any
    thread) and sent ahead of the next request.
    """

    def __init__(self, sock_path: str | None = None, address: str | None = None, token: str | None = None,
                 timeout: float | None = None, autostart: bool = True):
        # Seconds a reply may take, whole: a deadline, not a wait between bytes. An open may build an index or
        # wait for memory, so by default it has ten minutes; a timeout the user gives holds for opens too.
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self.open_timeout = OPEN_TIMEOUT if timeout is None else timeout
        self.address = address
        self.pid = os.getpid()
        self.dead = False
        self._lock = threading.Lock()
        self._releases: list[tuple[int, int]] = []
        self._fds: collections.deque[list[int]] = collections.deque()
        self._buf = bytearray()
        self._tag = 0
        self._stash: dict[int, tuple] = {}
        self._waiting: set[int] = set()
        self._dropped: set[int] = set()
        if address:
            host, port = address.rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)), timeout=self.timeout)
            self.shm = False
            token = token or _token_for(address)
        else:
            path = sock_path or default_socket()
            private_dir(os.path.dirname(path), create=False)
            try:
                self.sock = self._connect(path)
            except OSError:
                if not autostart:
                    raise DaemonGone(f"no riffle daemon at {path}; start one with `riffle serve`") from None
                start_daemon(path)
                self.sock = self._connect(path)
            uid = _peer_uid(self.sock)
            if uid != os.geteuid():
                self.sock.close()
                raise UnsafeSocket(f"the process answering at {path} runs as uid {uid}, not as you (uid {os.geteuid()})")
            self.shm = True
        self.sock.settimeout(self.timeout)
        hello = self.request({"op": wire.OP_HELLO, "version": wire.VERSION, "token": token or ""})
        self.server = hello[0].get("server", "")

    def _connect(self, path: str) -> socket.socket:
        """A socket connected to the daemon at ``path``. A blocking connect would wait for as long as the daemon's
        listen queue is full (a daemon stopped, or swamped): the timeout holds for it too."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                sock.connect(path)
                return sock
            except BlockingIOError:  # its queue is full
                if time.monotonic() >= deadline:
                    sock.close()
                    raise DaemonGone(f"the riffle daemon at {path} did not take the connection within {self.timeout:g}s") from None
                time.sleep(0.01)
            except OSError:
                sock.close()
                raise

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def queue_release(self, job: int, seq: int) -> None:
        self._releases.append((job, seq))

    def _releases_frames(self) -> list[bytes]:
        """The queued releases as frames, one per job, to go ahead of the next request."""
        if not self._releases:
            return []
        pending, self._releases = self._releases, []
        by_job: dict[int, list[int]] = {}
        for job, seq in pending:
            by_job.setdefault(job, []).append(seq)
        return [wire.encode({"op": wire.OP_RELEASE, "job": job, "seqs": seqs}) for job, seqs in by_job.items()]

    def _gone(self, message: str) -> DaemonGone:
        """Mark the connection dead (the next connect() makes another) and say why."""
        self.dead = True
        return DaemonGone(message)

    def _send(self, frames: list[bytes]) -> None:
        try:
            self.sock.sendall(b"".join(frames))
        except OSError as e:
            raise self._gone(f"the riffle daemon went away: {e}") from None

    def _readable(self) -> bool:
        """Whether a read would not wait: data is there, or the socket is closed (the read then says so)."""
        try:
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def _fill(self, n: int, deadline: float, waited: float) -> None:
        """Read until ``n`` bytes are buffered, collecting passed descriptors, by ``deadline`` (time.monotonic()):
        a daemon that sends part of a frame, or a byte at a time, cannot hold the caller past it."""
        while len(self._buf) < n:
            if self._releases and not self._readable():
                # About to wait for the daemon: it may be waiting for these
                # batches' memory to load the next (a job whose memory the
                # daemon bent below what this loader pipelines within).
                self._send(self._releases_frames())
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._gone(f"the riffle daemon did not answer within {waited:g}s")
            try:
                self.sock.settimeout(left)
                if self.shm:
                    data, anc, _, _ = self.sock.recvmsg(max(n - len(self._buf), 1 << 16), socket.CMSG_SPACE(4 * 4))
                    for level, kind, fdata in anc:
                        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                            fds = array.array("i")
                            fds.frombytes(fdata[: len(fdata) - len(fdata) % fds.itemsize])
                            self._fds.append(list(fds))
                else:
                    data = self.sock.recv(max(n - len(self._buf), 1 << 16))
            except socket.timeout:
                raise self._gone(f"the riffle daemon did not answer within {waited:g}s") from None
            except OSError as e:
                raise self._gone(f"the riffle daemon went away: {e}") from None
            if not data:
                raise self._gone("the riffle daemon closed the connection (did it die?)")
            self._buf += data

    def send(self, msg: dict[str, Any]) -> int:
        """Send one request (after any queued releases); return the tag :meth:`receive` takes."""
        return self.send_many([msg])[0]

    def send_many(self, msgs: Sequence[dict[str, Any]]) -> list[int]:
        """Send requests (after any queued releases) in one write; return their tags, for :meth:`receive`.

        One write for several requests: each write wakes the daemon's reader, which costs both sides more
        than the bytes do."""
        if os.getpid() != self.pid:
            raise RiffleError("a riffle connection cannot cross fork(); each process connects itself")
        tags = list(range(self._tag + 1, self._tag + 1 + len(msgs)))
        try:
            encoded = [wire.encode(dict(msg, tag=tag)) for msg, tag in zip(msgs, tags)]
        except wire.FieldError as e:
            # As the daemon names a field it cannot decode.
            if e.field.startswith("spec."):
                raise InvalidSpec(f"invalid job spec: {e.field[len('spec.'):]}: {e.why}") from None
            raise RiffleError(f"malformed request: {e}") from None
        for msg, frame in zip(msgs, encoded):
            if len(frame) - 4 > wire.MAX_HEADER:
                # The daemon would not read it: it bounds what any client may make it hold.
                raise InvalidSpec(f"invalid job spec: the {msg.get('op')} request is {len(frame) - 4} bytes, at most "
                                  f"{wire.MAX_HEADER}: name fewer or shorter paths (a glob or a directory names many "
                                  "files in one path)")
        self._tag += len(msgs)
        frames = self._releases_frames() + encoded
        self._send(frames)
        self._waiting.update(tags)
        return tags

    def _read_reply(self, deadline: float, waited: float) -> tuple[dict[str, Any], bytes | None, list[int]]:
        self._fill(4, deadline, waited)
        # Once a frame has begun, its rest comes within the connection's timeout, however long an open may wait.
        if deadline - time.monotonic() > self.timeout:
            deadline, waited = time.monotonic() + self.timeout, self.timeout
        try:
            n = wire.header_length(self._buf[:4], wire.MAX_REPLY)
            self._fill(4 + n, deadline, waited)
            reply = wire.decode(self._buf[4 : 4 + n])  # json reads a bytearray as it is
        except wire.FrameError as e:
            raise self._gone(f"the riffle daemon sent a malformed frame ({e})") from None
        total = 4 + n + int(reply.get("payload") or 0)
        self._fill(total, deadline, waited)
        payload = bytes(self._buf[4 + n : total]) if reply.get("payload") else None
        del self._buf[:total]
        # Only "opened" frames carry descriptors (one arena each), with the
        # first byte of the frame: hand them to the opened frames in order.
        fds = self._fds.popleft() if reply["op"] == wire.OP_OPENED and reply.get("arena_size") and self._fds else []
        return reply, payload, fds

    def receive(self, tag: int, timeout: float | None = None) -> tuple[dict[str, Any], bytes | None, list[int]]:
        """Read the reply to request ``tag``: the header, its payload and any passed descriptors."""
        if tag in self._stash:
            got = self._stash.pop(tag)
        else:
            waited = self.timeout if timeout is None else timeout
            deadline = time.monotonic() + waited
            try:
                while True:
                    got = self._read_reply(deadline, waited)
                    t = got[0].get("tag", 0)
                    self._waiting.discard(t)
                    if t == tag:
                        break
                    if t in self._dropped:
                        self._dropped.discard(t)
                        for fd in got[2]:
                            os.close(fd)
                    else:
                        self._stash[t] = got
            finally:
                if not self.dead:
                    self.sock.settimeout(self.timeout)
        reply, payload, fds = got
        if reply["op"] == wire.OP_ERROR:
            for fd in fds:
                os.close(fd)
            raise error_from(reply)
        return reply, payload, fds

    def drop(self, tag: int) -> None:
        """Give up on the reply to request ``tag``."""
        if tag in self._stash:
            for fd in self._stash.pop(tag)[2]:
                os.close(fd)
        elif tag in self._waiting:
            self._dropped.add(tag)

    def request(self, msg: dict[str, Any], timeout: float | None = None) -> tuple[dict[str, Any], bytes | None, list[int]]:
        """Send one request; return the reply, its payload and any passed descriptors."""
        with self._lock:
            return self.receive(self.send(msg), timeout)


_connections: dict[tuple, Connection] = {}
_conn_lock = threading.Lock()


def _after_fork() -> None:
    """A child forked while another thread held the lock (in connect(), which may wait for a daemon to start)
    would wait for it forever, and DataLoader forks its workers from whatever threads the user runs: the child
    starts with a lock of its own, and without the parent's connections, which cannot cross fork()."""
    global _conn_lock
    _conn_lock = threading.Lock()
    _connections.clear()


os.register_at_fork(after_in_child=_after_fork)


def connect(sock_path: str | None = None, address: str | None = None, token: str | None = None,
            timeout: float | None = None, autostart: bool = True) -> Connection:
    """A shared connection for this process and thread to the daemon at ``sock_path`` or ``address``."""
    key = (os.getpid(), threading.get_ident(), sock_path or default_socket(), address, token)
    with _conn_lock:
        c = _connections.get(key)
        if c is None or c.dead:
            if c is not None:
                c.close()
            c = Connection(sock_path, address, token, timeout, autostart)
            _connections[key] = c
        return c


def _forget(conn: Connection) -> None:
    with _conn_lock:
        for k, v in list(_connections.items()):
            if v is conn:
                del _connections[k]
    conn.close()
