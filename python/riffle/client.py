"""The connection to the riffle daemon and the :class:`Loader` over it.

A :class:`Loader` is an iterable of :class:`Batch` objects, one epoch per
``iter()``: a fresh global shuffle of ``seed`` and the epoch each time. The
daemon (``riffle serve``) reads each batch's records straight into shared
memory; a :class:`Batch` here is a view of that memory, not a copy. Its bytes
stay valid while anything refers to the batch or to an array made from it
(``batch.raw``, ``decode.fixed(batch)``, ``torch.from_numpy`` of those):
only when the last reference goes is the region given back to the daemon
for a later batch.

If no daemon answers at the socket, the client starts one and later clients
on the machine share it. The socket's directory must belong to this user
with mode 0700, and the daemon answering must run as this user: otherwise
someone else could stand in for the daemon.
"""

from __future__ import annotations

import array
import base64
import errno
import collections
import gc
import json
import math
import mmap
import os
import select
import shutil
import socket
import stat
import struct
import subprocess
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from . import spec, wire


class RiffleError(Exception):
    """An error from riffle; ``path`` and ``offset`` say where in the data, if known."""

    def __init__(self, message: str, path: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.path = path
        self.offset = offset


class InvalidSpec(RiffleError, ValueError):
    """An argument the daemon refuses (an option out of bounds, a format it cannot read): also a ``ValueError``."""


class PathNotFound(RiffleError, FileNotFoundError):
    """A path names nothing: also a ``FileNotFoundError``, as ImageFolder raises."""

    def __init__(self, message: str, path: str | None = None, offset: int | None = None):
        super().__init__(message, path, offset)
        self.errno, self.strerror, self.filename = errno.ENOENT, message, path

    def __str__(self) -> str:
        return self.strerror


class DataError(RiffleError):
    """The data is bad: corrupt, truncated, a CRC mismatch, a record a transform refused."""


class DataChanged(DataError):
    """The data changed since the job opened it: build a new loader to read it as it is now."""


def _shared(options: dict, shuffle: bool = True) -> bool:
    """Whether these options (a spec, or a loader's keywords) ask for a shared order: ``share`` with the global
    shuffle, the one order jobs sample dependently (job.Check's rule); another order with ``share`` reads alone."""
    kind = options.get("sampler")
    return bool(options.get("share")) and (kind == "global" or (kind is None and options.get("shuffle", shuffle) is not False))


def _restable(options: dict, shuffle: bool = True) -> bool:
    """Whether the order these options ask for resumes on another topology as the rest of its epoch, from the places
    of every part (rank, worker) of the run: a shared order, whose records each rank's group chose, or an
    opportunistic global one, whose windows deliver records in the order reads end (job.Check's rule)."""
    kind = options.get("sampler")
    return _shared(options, shuffle) or (
        int(options.get("opportunistic") or 1) > 1 and not options.get("mixture")
        and (kind == "global" or (kind is None and options.get("shuffle", shuffle) is not False)))


def _positional(options: dict, shuffle: bool = True) -> bool:
    """Whether the order these options (a spec, or a loader's keywords: the same names) ask for is a function of
    (seed, epoch, position), so that a place in it is a position any topology resumes from (auto picks a global or
    a block order)."""
    return (not _shared(options, shuffle) and int(options.get("opportunistic") or 1) <= 1
            and options.get("sampler") in (None, "global", "block", "sequential", "buffered", "reservoir", "auto"))


def _rest(state: dict, world: int, workers: int | None = None) -> bool:
    """Whether a shared order's state resumes as the rest of its epoch: it is one already, or it was saved on
    another topology (ranks, or DataLoader workers: ``workers`` is this run's, None if not asked)."""
    def any_delivered(st: dict) -> bool:
        return bool(st.get("delivered") or st.get("rest")) or any(any_delivered(r) for r in (st.get("workers") or {}).values())
    if not (int(state.get("batch", 0)) or state.get("sampler_state") or state.get("skip") or "workers" in state
            or "ranks" in state or any_delivered(state)):
        return False  # an epoch's start: any topology begins it
    saved_workers = int(state.get("num_workers", 0)) if "workers" in state else 0
    return ("ranks" in state or any_delivered(state) or int(state.get("world", world)) != world
            or (workers is not None and max(1, saved_workers) != max(1, workers)))


def _own(state: dict, world: int, rank: int, workers: int | None = None) -> dict:
    """Of every rank's states merged, this rank's own, when the run goes on on the topology that saved them and
    not in the rest of an epoch: it resumes as it was. Any other state as it is."""
    if "ranks" not in state or int(state.get("world", world)) != world:
        return state
    own = state["ranks"].get(str(rank))
    if own is None or any(_rest(st, world, workers) for st in state["ranks"].values()):
        return state
    return own


def _rest_places(state: dict, world: int, rank: int, drop_last: bool = False,
                 shared: bool = True) -> tuple[int, list[dict]]:
    """A shared or opportunistic order's state as the rest of its epoch: the epoch, and the places of every part
    (rank, worker) of the run that saved it, whose records the rest leaves out. A uniform permutation's rest, given
    the records before it, is a uniform permutation of the others, so any topology goes on from them exactly
    once. A shared part's place is the set it delivered; an opportunistic one's, its window less what it delivered
    of it (``skip``), in batches of its ``batch_size`` in windows of ``window``."""
    saved = int(state.get("world", world))
    if "ranks" in state:
        ranks = {int(r): st for r, st in state["ranks"].items()}
        if set(ranks) != set(range(saved)):
            raise ValueError(f"this merged state holds the states of ranks {sorted(ranks)} of {saved}: every rank's "
                             "is needed to resume a shared order")
        parts = list(ranks.values())
    elif saved != world and saved > 1:
        raise ValueError(f"this state is one rank's of {saved}, and this run has {world}: a shared or opportunistic "
                         "order's ranks deliver records whose place their own state alone says, so resuming on "
                         "another number of ranks needs every rank's state: save each (or state_dict(all_ranks=True) "
                         "in riffle.torch) and pass riffle.merge_states([...])")
    else:
        if saved == world:
            _check_rank(state, rank)
        parts = [state]  # of one rank: every rank's
    # Each role (a rank's DataLoader worker, or the rank) and whose part it is.
    roles = []
    for p in parts:
        whose = {"rank": int(p.get("rank", 0) or 0), "world": saved, "drop_last": bool(drop_last)}
        if not shared and p.get("batch_size") and p.get("window"):
            whose.update(batch_size=int(p["batch_size"]), window=int(p["window"]))
        if "workers" in p:
            k = int(p.get("num_workers", len(p["workers"])))
            roles += [(r, dict(whose, worker=int(w), workers=k)) for w, r in p["workers"].items()]
        else:
            roles.append((p, dict(whose, worker=0, workers=1)))
    epoch = min(int(r["epoch"]) for r, _ in roles)
    # A role handed the places of the run before a rest, not opened yet, holds them (``rest``); once opened, it
    # holds the rest's basis instead (``delivered``: one set, the daemon's), and its place is of the rest's run.
    # When any role opened, the run is the rest's: every role's place is of it, those not opened having delivered
    # none; when none did, the places handed are all there is. (A shared order's places are sets: any union of
    # them is what was delivered, so a shared role's handed places are kept too.)
    opened = any(r.get("delivered") for r, _ in roles)
    places, seen, progress = [], set(), False
    for r, part in roles:
        own = []
        moved = bool(int(r.get("batch", 0)) or r.get("skip") or r.get("sampler_state") or int(r["epoch"]) > epoch)
        unopened = bool(r.get("rest")) and not (opened and not shared)
        if int(r["epoch"]) > epoch:
            # Past the epoch: this part delivered all of its records of it, which only whose part it is names (of
            # a rest, dealt from what its run was opened without: the places it ended with say what).
            own = [{"epoch": int(r["epoch"]), "batch": 0, "part": part}] + list(r.get("ended") or [])
        elif r.get("sampler_state") or (not shared and not unopened):
            # An opportunistic part's place, even at its start: the rest needs every rank's.
            own = [{"epoch": int(r["epoch"]), "batch": int(r["batch"]), "skip": list(r.get("skip") or []),
                    "part": part}]
            if r.get("sampler_state"):
                own[0]["sampler_state"] = r["sampler_state"]
        elif moved:
            raise ValueError(f"a place in epoch {epoch} (batch {r['batch']}) without its sampler state: it was taken "
                             "after its job closed; call state_dict() while iterating")
        if own and not shared and "batch_size" not in part:
            raise ValueError("this state of an opportunistic order does not say its batch size and window (an older "
                             "riffle saved it): resume it on the topology that saved it")
        progress = progress or moved
        kept = list(r.get("delivered") or [])
        if not (opened and not shared):
            kept += list(r.get("rest") or [])
        for p in kept + own:
            key = json.dumps(p, sort_keys=True)
            if key not in seen:
                seen.add(key)
                places.append(p)
    if progress and saved > 1 and "ranks" not in state:
        # Every rank at the start of one rest (the same places) deals it alike; past it, each rank's own progress
        # is needed to deal the rest again.
        raise ValueError(f"this state is one rank's of {saved}, of a shared or opportunistic order on another number of DataLoader "
                         "workers (or in the rest of an epoch resumed so): the rest of its epoch is dealt to the "
                         "ranks from what every rank delivered, so it needs every rank's state: "
                         "state_dict(all_ranks=True) in riffle.torch, or riffle.merge_states([...])")
    return epoch, places


def _check_rank(state: dict, rank: int) -> None:
    """Refuse another rank's state of a shared or opportunistic order: its ranks read other records, in windows of
    their own."""
    if state.get("rank") is not None and "ranks" not in state and int(state["rank"]) != rank:
        raise ValueError(f"this state is rank {state['rank']}'s, and this loader is rank {rank}: a shared or "
                         "opportunistic order's ranks deliver other records; load each rank's own state (or "
                         "riffle.merge_states of them all)")


def merge_states(states: Sequence[dict]) -> dict:
    """Every rank's ``state_dict()`` of one step as one state, which any number of ranks and DataLoader workers
    resumes from. An order that is a function of position needs only one rank's state; a shared order's ranks read
    records their daemons chose, so a resume on another number of ranks needs them all."""
    states = list(states)
    if not states:
        raise ValueError("merge_states: no states")
    world = int(states[0].get("world", 1))
    ranks = {}
    for k, st in enumerate(states):
        if int(st.get("world", 1)) != world or st.get("seed") != states[0].get("seed"):
            raise ValueError(f"merge_states: state {k} is of another run (world {st.get('world')}, seed {st.get('seed')})")
        if "ranks" in st:
            ranks.update({int(r): v for r, v in st["ranks"].items()})
            continue
        r = int(st.get("rank", k))
        if r in ranks:
            raise ValueError(f"merge_states: rank {r}'s state given twice")
        ranks[r] = st
    if set(ranks) != set(range(world)):
        raise ValueError(f"merge_states: the states of ranks {sorted(ranks)}, of a world of {world}: give every rank's")
    out = {k: v for k, v in states[0].items() if k not in ("sampler_state", "skip", "delivered", "rest", "workers", "rank",
                                                          "num_workers", "next_worker")}
    out["ranks"] = {str(r): ranks[r] for r in sorted(ranks)}
    out["epoch"] = min(int(st["epoch"]) for st in ranks.values())
    return out


def _check_dataset(state: dict, version: str | None) -> None:
    """Refuse a state saved over other data: its place would name other records."""
    if state.get("dataset") and version and state["dataset"] != version:
        raise DataChanged("this state was saved for another dataset, or another version of its files (added, "
                          "removed or rewritten since): its place names records these files do not hold in that "
                          "order; resume with the data it was saved with, or start the epoch anew")


class JobClosed(RiffleError):
    """The job, or the daemon, was closing."""


class MemoryBudget(RiffleError, MemoryError):
    """The job does not fit the daemon's memory budget: it needs more than the budget holds, or waited for room
    while other jobs held it. The message says how much it needs and what holds the budget; a smaller ``memory``
    or ``batch_size`` fits sooner. Also a ``MemoryError``."""


class DaemonGone(RiffleError):
    """The daemon closed the connection or stopped answering."""


# The error frame's kind (wire.KIND_*) and the exception it raises.
_KINDS: dict[str, type[RiffleError]] = {
    wire.KIND_SPEC: InvalidSpec, wire.KIND_NOT_FOUND: PathNotFound, wire.KIND_DATA: DataError,
    wire.KIND_CHANGED: DataChanged, wire.KIND_CLOSED: JobClosed, wire.KIND_MEMORY: MemoryBudget,
}


def error_from(reply: dict[str, Any]) -> RiffleError:
    """The exception an error frame stands for."""
    cls = _KINDS.get(reply.get("kind") or "", RiffleError)
    return cls(reply.get("message", "error"), reply.get("path") or None, reply.get("offset"))


class UnsafeSocket(RiffleError):
    """The socket's directory, or the daemon behind it, is not this user's."""


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
    if not built.exists() and (repo / "go.mod").exists():
        go = shutil.which("go") or "/usr/local/go/bin/go"
        subprocess.run([go, "build", "-o", str(built), "./cmd/riffle"], cwd=repo, check=True)
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


class Batch:
    """One batch. Record ``i`` is ``ids[i]``; its bytes are ``record(i)``.

    ``raw`` is the batch's bytes as a uint8 array in shared memory; the
    region returns to the daemon only when no array or memoryview made from
    the batch is alive any more. ``state`` is the loader's place after this
    batch (what ``state_dict()`` returns then).
    """

    __slots__ = ("epoch", "index", "last", "n", "ids", "offs", "lens", "labels", "raw", "info", "packed", "_state",
                 "_dtype", "_shape", "_table", "_lease", "__weakref__")

    def __init__(self, epoch: int, index: int, last: bool, ids, offs, lens, labels, raw: np.ndarray, info: dict,
                 dtype=None, shape=None, state=None):
        self._dtype, self._shape = dtype, shape
        self.epoch, self.index, self.last = epoch, index, last
        self.n = len(ids)
        self.ids, self.offs, self.lens, self.labels = ids, offs, lens, labels
        self.raw = raw
        self.info = info
        self._state = state  # a dict, or a function giving one (asked of the daemon once)
        self._lease = None  # (job, seq, data_off, finalizer) of a batch in shared memory, for Loader.lend
        # A batch of rows (Arrow, Parquet): (body offset, nodes (n, 2), buffers (n, 2)) of its Arrow message;
        # internal: `data` is the batch as a pyarrow.RecordBatch.
        self._table: tuple[int, np.ndarray, np.ndarray] | None = None
        # Packed: records back to back from offset 0 in their order, as
        # fixed-size records of a global shuffle read without O_DIRECT are.
        # (Each record ends where the next begins, the first at 0 and the last at the end.)
        if self.n == 0:
            self.packed = True
        else:
            ends = offs + lens
            self.packed = bool(offs[0] == 0 and ends[-1] == len(raw) and (offs[1:] == ends[:-1]).all())

    @property
    def rows(self) -> bool:
        """Whether the batch is of rows (Arrow, Parquet, Hugging Face): ``data`` is then a ``pyarrow.RecordBatch``
        (or, without pyarrow, ``decode.columns(batch)`` a dict of columns)."""
        return self._table is not None

    @property
    def state(self) -> dict | None:
        """The loader's place after this batch, to resume there."""
        if callable(self._state):
            self._state = self._state()
        return self._state

    def record(self, i: int) -> memoryview:
        """Record ``i``'s bytes, a view of the batch."""
        o = int(self.offs[i])
        return memoryview(self.raw[o : o + int(self.lens[i])])

    def records(self) -> list[memoryview]:
        """Every record's bytes, as views of the batch."""
        return [self.record(i) for i in range(self.n)]

    @property
    def data(self):
        """The records as the dataset's natural type.

        Fixed-size records: one ``(n, record_size)`` uint8 array, or of the
        loader's ``dtype``/``shape``; ``.npy`` rows: the file's dtype and row
        shape (a structured array for structured dtypes); rows of Arrow and
        Parquet files: a ``pyarrow.RecordBatch`` over the batch's memory if
        pyarrow is installed, else a dict of columns (``decode.columns``);
        anything else: a list of memoryviews. Arrays are views of the batch
        when its records are packed.
        """
        from . import decode
        fmt = self.info.get("format")
        if self._table is not None:
            return decode.arrow(self)
        if self.info.get("transform"):
            # The daemon's transform outputs: fixed-size, of the dtype and shape it reports.
            return decode.fixed(self, np.dtype(self.info["dtype"]), self.info.get("shape") or None)
        if fmt == "npy" and self._dtype is None:
            return decode.npy(self)
        if fmt in ("fixed", "npy"):
            return decode.fixed(self, self._dtype or np.uint8, self._shape)
        if fmt == "riffle" and self.info.get("record_size"):
            # A pack of fixed-size records (a transform's outputs among them).
            dt = self._dtype or (decode.npy_dtype(self.info["dtype"]) if self.info.get("dtype") else np.uint8)
            return decode.fixed(self, dt, self._shape or self.info.get("shape") or None)
        if fmt == "tar":
            return decode.tar(self)
        return self.records()

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"<riffle.Batch epoch={self.epoch} index={self.index} n={self.n} bytes={len(self.raw)}>"


def _give_back(conn_ref, job: int, seq: int, loader: "Loader", size: int) -> None:
    """A batch's region goes back to the daemon (with the next request) and out of its loader's held bytes."""
    conn = conn_ref()
    if conn is not None:
        conn.queue_release(job, seq)
    loader._held -= size


class _Taken:
    """What a loader of a shared order delivered of one epoch since its job opened, kept so that the job's state,
    which is the daemon's, outlives a daemon killed (share's RFBIT1): the state the job opened from, a bit a record
    delivered since, and the last batches' ids, to say the state after an earlier batch (a Batch's state asked
    late)."""

    RECENT = 256  # batches whose state can still be asked after later ones came

    MAGIC = b"RFBIT1\x00"

    def __init__(self, epoch: int, base: bytes | None):
        self.epoch, self.base = epoch, base
        self.bits = np.zeros(0, dtype=np.uint8)
        if base is not None and base.startswith(self.MAGIC):
            # Reopened from a state kept here (a daemon killed again): its
            # bits are ours, its base the base, so the state stays one set.
            head, rest = base[len(self.MAGIC):].split(b"\n", 1)
            n = int(head.split()[2])
            self.base, self.bits = rest[:n] or None, np.frombuffer(rest[n:], np.uint8).copy()
        self.count = 0  # batches kept
        self.recent: collections.deque[np.ndarray] = collections.deque(maxlen=self.RECENT)

    def add(self, ids: np.ndarray) -> None:
        if len(ids):
            need = (int(ids.max()) >> 3) + 1
            if need > len(self.bits):
                self.bits = np.concatenate([self.bits, np.zeros(max(need, 2 * len(self.bits)) - len(self.bits),
                                                                np.uint8)])
            np.bitwise_or.at(self.bits, ids >> 3, (1 << (ids & 7)).astype(np.uint8))
        self.count += 1
        self.recent.append(ids)

    def state(self, positions: int, n: int) -> bytes | None:
        """The state after the first n batches kept: b"" at the epoch's start, None if no longer known."""
        if self.base is None and n == 0 and not self.bits.any():
            return b""
        later = self.count - n
        if later > len(self.recent):
            return None
        bits = self.bits
        if later:
            bits = bits.copy()
            for ids in list(self.recent)[len(self.recent) - later:]:
                np.bitwise_and.at(bits, ids >> 3, ~(1 << (ids & 7)).astype(np.uint8))
        base = self.base or b""
        return self.MAGIC + b"%d %d %d\n" % (self.epoch, positions, len(base)) + base + bits.tobytes()


class _Job:
    """An open job: its connection, shared memory and place."""

    def __init__(self, conn: Connection, reply: dict, mm: mmap.mmap | None, epoch: int, batch: int, start: int = 0,
                 fd: int | None = None):
        self.conn, self.reply, self.mm = conn, reply, mm
        # The arena's descriptor, kept to lend batches to another process
        # (Loader.lend); the batches lent, by seq: what gives each back.
        self.fd = fd
        self.lent: dict[int, tuple] = {}
        self.returns: int | None = None  # the pipe's read end the borrower gives seqs back through
        self.key: str | None = None
        self.id = reply["job"]
        self.epoch, self.batch = epoch, batch  # the next batch it delivers
        self.start = start  # the epoch's positions delivered before it, if it is the rest of one
        self.rest = bool(reply.get("delivered"))  # the rest of a shared order's epoch, without what others delivered
        # Batches it delivers of its first epoch from where it opened, then
        # of each whole epoch: the daemon's counts, never worked out here
        # (the stride of a shared job is the daemon's to decide).
        self.left_first = int(reply.get("left", 0))
        self.per_epoch = int(reply.get("batches", 0))
        self.opened_at = (epoch, batch)
        # The daemon keeps a growing sampler state to itself; ask for it.
        self.stream = bool(reply.get("stream"))
        self.weights: tuple[int, int] | None = None  # a mixture's: the loader's change count, and the epoch's weights

    def state(self, epoch: int, batch: int) -> dict:
        """The job's state at a place it delivered lately (sampler state included)."""
        reply, _, _ = self.conn.request({"op": wire.OP_STATE, "job": self.id, "epoch": epoch, "index": batch})
        return reply.get("state") or {}

    def close(self) -> None:
        try:
            self.conn.drop(self.conn.send({"op": wire.OP_CLOSE, "job": self.id}))
        except RiffleError:
            pass
        # The mmap stays mapped while any batch's arrays refer to it; a
        # borrower's mapping of the arena stays valid too (the daemon keeps
        # the pages of batches not given back), and its later give-backs
        # find the pipe closed.
        for fd in (self.fd, self.returns):
            if fd is not None:
                os.close(fd)
        self.fd = self.returns = None


def _close_job(job: _Job | None) -> None:
    if job is not None:
        job.close()


def _subset(s) -> dict | None:
    """A subset as the daemon takes it: a range, ids, or a dict of ranges, ids and labels."""
    if s is None or isinstance(s, dict):
        return s
    if isinstance(s, range):
        if s.step != 1:
            return {"ids": list(s)}
        return {"ranges": [[s.start, s.stop]]}
    return {"ids": [int(i) for i in s]}


def _ids(ids) -> dict:
    """ids= as a subset: an array of ids, or a file of them (an integer .npy, or one id per line) the daemon reads."""
    if isinstance(ids, (str, os.PathLike)):
        p = os.fspath(ids)
        if "://" not in p and not os.path.exists(p):
            raise PathNotFound(f"No such file or directory: {p!r}", p)
        return {"ids_file": _abspath(p)}
    a = np.asarray(ids)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"ids: want a one-dimensional array of integer ids, or a file of them; got {a.dtype} of shape {a.shape}")
    return {"ids": [int(i) for i in a]}


_FILTER_KEYS = {"label": "labels", "labels": "labels", "min_size": "min_size", "max_size": "max_size", "glob": "glob",
                "column": "column", "in": "in", "min": "min", "max": "max"}


def _filter(f) -> dict | None:
    """filter= as the daemon takes it: label(s), min_size, max_size, glob."""
    if f is None:
        return None
    if not isinstance(f, dict) or not f:
        raise ValueError(f"filter: want a dict of label, min_size, max_size, glob, or column with in, min or max; got {f!r}")
    out: dict[str, Any] = {}
    for k, v in f.items():
        if k not in _FILTER_KEYS:
            raise ValueError(f"filter: unknown test {k!r} (known: {', '.join(_FILTER_KEYS)})")
        if _FILTER_KEYS[k] == "labels":
            out["labels"] = [int(x) for x in (v if isinstance(v, (list, tuple, set, range, np.ndarray)) else [v])]
        elif k == "in":
            vals = v if isinstance(v, (list, tuple, set, np.ndarray)) else [v]
            out["in"] = [x.item() if isinstance(x, np.generic) else x for x in vals]
        elif k in ("min", "max"):
            out[k] = float(v)
        else:
            out[_FILTER_KEYS[k]] = v
    return out


def _check_args(paths: Sequence, batch_size: Any) -> None:
    """What can be checked without the daemon, with the errors DataLoader and ImageFolder raise."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size!r}")
    if not paths:
        raise ValueError("paths: none given")
    for p in paths:
        p = os.fspath(p)
        if "://" in p or any(c in p for c in "*?["):
            continue  # an object or a glob: the daemon says
        if not os.path.exists(p):
            raise PathNotFound(f"No such file or directory: {p!r}", p)


def _check_sendable(name: str, value: Any) -> None:
    """Refuse an option's value the daemon cannot be sent (a Python object where riffle takes a name or a number),
    naming the option: json.dumps would say only that some object is not serializable."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        keyword, kind = spec.OPTIONS[name][0], spec.OPTIONS[name][1]
        hint = ""
        if name == "sampler":
            hint = (": riffle orders and shards the records itself (rank= and world_size= split each epoch as "
                    "DistributedSampler does); riffle.torch.loader takes a DistributedSampler, RandomSampler, "
                    "SequentialSampler or SubsetRandomSampler and reads what it says")
        raise TypeError(f"riffle: {keyword}= takes a {kind} ({spec.OPTIONS[name][5]}), not a "
                        f"{type(value).__name__}{hint}") from None


def _mixture(mixture) -> list[dict]:
    """A mixture as the daemon takes it, [{"paths": [...], "weight": w}, ...], from [(paths, weight), ...]."""
    if isinstance(mixture, (str, bytes, os.PathLike)) or not isinstance(mixture, Sequence) or not mixture:
        raise ValueError(f"mixture: want a list of (paths, weight), got {mixture!r}")
    out = []
    for k, src in enumerate(mixture):
        try:
            paths, w = (src["paths"], src["weight"]) if isinstance(src, dict) else src
        except (TypeError, ValueError, KeyError):
            raise ValueError(f"mixture source {k}: want (paths, weight), got {src!r}") from None
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        _check_args(paths, 1)
        out.append({"paths": [_abspath(p) for p in paths], "weight": _weight(w, f"mixture source {k}")})
    return out


def _weight(w, what: str) -> float:
    if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) or not (w > 0 and math.isfinite(w)):
        raise ValueError(f"{what}: weight {w!r}, want a positive finite number")
    return float(w)


def _segments(mixture: list[dict], history: Sequence[dict] | None) -> list[tuple[int, list[float]]]:
    """A mixture's weights as (first epoch, weights) segments: its history's, then its own."""
    segs, start = [], 0
    for h in history or []:
        segs.append((start, [float(w) for w in h["weights"]]))
        start = int(h["until"])
    segs.append((start, [s["weight"] for s in mixture]))
    return segs


def _with_weights(segs: list[tuple[int, list[float]]], weights: Sequence[float], epoch: int, n: int) -> list[tuple[int, list[float]]]:
    """segs with weights from epoch on: the weights of the epochs before stay, so every source goes on from where
    they had left it."""
    ws = [_weight(w, f"source {k}") for k, w in enumerate(weights)]
    if len(ws) != n:
        raise ValueError(f"{len(ws)} weights for a mixture of {n} sources")
    if epoch < segs[-1][0]:
        raise ValueError(f"weights from epoch {epoch}, before the last change, at epoch {segs[-1][0]}")
    return segs[:-1] + [(epoch, ws)] if epoch == segs[-1][0] else segs + [(epoch, ws)]


def _mixture_at(spec: dict, segs: list[tuple[int, list[float]]], epoch: int) -> tuple[dict, int]:
    """spec with the mixture's weights of epoch, and which segment that is: a job opens with the weights of its
    epoch and those before them."""
    k = max(i for i, (start, _) in enumerate(segs) if start <= epoch)
    spec = dict(spec, mixture=[dict(s, weight=w) for s, w in zip(spec["mixture"], segs[k][1])])
    spec.pop("mixture_history", None)
    if k:
        spec["mixture_history"] = _history(segs[:k + 1])
    return spec, k


def _history(segs: list[tuple[int, list[float]]]) -> list[dict]:
    """The weights before the last segment's, as the daemon takes them: each until the epoch the next begins."""
    return [{"until": segs[i + 1][0], "weights": segs[i][1]} for i in range(len(segs) - 1)]


def _weights_state(segs: list[tuple[int, list[float]]]) -> list[list]:
    """A mixture's weights as a state keeps them: [from epoch, weights] each."""
    return [[start, list(ws)] for start, ws in segs]


def _state_weights(state: dict, n: int) -> list[tuple[int, list[float]]]:
    """A state's mixture weights, checked."""
    segs = [(int(start), [_weight(w, "a state's mixture") for w in ws]) for start, ws in state["mixture_weights"]]
    if not segs or segs[0][0] != 0 or any(len(ws) != n for _, ws in segs):
        raise ValueError(f"this state's mixture weights are not of a mixture of {n} sources from epoch 0")
    return segs


def _abspath(p) -> str:
    p = os.fspath(p)
    return p if "://" in p else os.path.abspath(p)


class Loader:
    """An iterable of batches of a dataset in a global shuffle, one epoch per iteration.

    ``paths`` is a file, a glob, a directory (ImageFolder) or a list of
    those. ``batch.data`` gives fixed-size records as an ``(n, ...)`` array of
    ``dtype`` and per-record ``shape`` (``.npy``: the file's), other records
    as memoryviews. Records come in a random order inside each batch
    (``ordered=True`` keeps the sampler's). ``sampler`` picks a cheaper
    order than the global shuffle: ``"block"``, ``"buffered"``,
    ``"reservoir"``, or ``"sequential"``; ``opportunistic=W`` makes each
    batch of whichever records of the next W batches arrive first.

    ``subset`` reads part of the dataset: a ``range``, a list of ids, or
    ``{"ranges": [[lo, hi], ...], "ids": [...], "labels": [...]}``; ``ids``
    an array of ids or a file of them (an integer ``.npy``, or one id per
    line). ``filter`` keeps the records (of the subset) that pass every test
    given: ``{"label": 3}`` (or a list), ``{"min_size": n, "max_size": m}``
    bytes, ``{"glob": "*.jpg"}`` on the record's file, and on a dataset of
    rows ``{"column": "lang", "in": ["en", "de"]}`` or ``{"column": "score",
    "min": 0.5}`` on a column's values. ``dedup=True`` counts
    records of equal bytes once. Each is applied once, when the job opens:
    no byte of data is rewritten, and DDP ranks get equal parts of what is
    left. ``mixture=[(paths, weight), ...]`` instead of ``paths`` mixes
    datasets: each batch takes records from the sources in proportion to
    their weights, each source in its own shuffle; ``mixture_stop`` is
    ``"first_exhausted"`` (an epoch ends when the schedule names a source that
    is used up) or ``"all_exhausted"`` (when every source was used up, the
    others going on into their next epochs); ``set_weights`` changes the
    weights from the next epoch. ``refresh="epoch"`` lets a glob or directory
    dataset grow: each epoch reads the files found by its start, new files'
    records after the old ones', whose ids stay; a state resumes an epoch
    with the files it read.
    ``transform`` names a transform the daemon runs on every record
    (``"image:size=256,crop=224"``, ``"libsvm_dense:n_features=N"``);
    ``batch.data`` is then its outputs as one array. ``share=True`` lets the
    job sample dependently with the other sharing jobs on its source: each
    shared record is read (and transformed) once for all of them, and each
    job still sees each of its records once per epoch in a uniform order,
    though no longer one fixed by (seed, epoch).

    ``rank``/``world_size`` split each epoch as DistributedSampler does;
    ``rank_drop_last`` is its ``drop_last`` (drop the tail so ranks get
    equal shares) and ``drop_last`` DataLoader's (drop the last short
    batch). ``state_dict()`` is the place of the next batch; pass it to
    ``load_state_dict()`` to resume exactly there.

    The daemon keeps one job for this loader across epochs, reading the
    next epoch ahead while this one ends; ``close()`` (or dropping the
    loader) ends it.
    """

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike] | None = None, batch_size: int = spec.DEFAULT_BATCH_SIZE, *,
                 mixture: Sequence | None = None, mixture_stop: str | None = None, mixture_history: Sequence[dict] | None = None,
                 shuffle: bool = True, seed: int = 0, format: str | None = None, record_size: int | None = None,
                 header_bytes: int | None = None, csv_header: bool = False, skip_crc: bool = False,
                 drop_partial: bool = False, direct: bool | None = None, columns: Sequence[str] | None = None,
                 split: str | None = None, extensions: Sequence[str] | None = None, subset: dict | None = None,
                 transform: str | None = None,
                 rank: int = 0, world_size: int = 1, drop_last: bool = False, rank_drop_last: bool = False,
                 prefetch: int | None = None, depth: int | None = None, memory: int | None = None,
                 ordered: bool | None = None, epoch: int = 0, socket: str | None = None, address: str | None = None,
                 token: str | None = None, timeout: float | None = None, autostart: bool = True, dtype=None,
                 shape: Sequence[int] | None = None, sampler: str | None = None, block_size: int | None = None,
                 window: int | None = None, buffer: int | None = None, reservoir: int | None = None,
                 opportunistic: int | None = None, pipeline: int = 8, share: bool | None = None,
                 batch_stride: int | None = None, batch_offset: int | None = None, reconnect: float = 60.0,
                 shard_drop_last: bool | None = None, ids: Any = None, filter: dict | None = None, dedup: bool = False,
                 refresh: str | None = None, min_randomness: float | None = None, auto_order: dict | None = None):
        if shard_drop_last is not None:
            # The old name: a "shard" is a pack's file of records, a rank's split of an epoch its part.
            warnings.warn("shard_drop_last is now rank_drop_last", DeprecationWarning, stacklevel=2)
            rank_drop_last = rank_drop_last or shard_drop_last
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        if mixture is not None:
            if paths:
                raise ValueError("both paths and mixture= given: a mixture names its sources' paths itself")
            _check_args(["."], batch_size)
            mixture = _mixture(mixture)
        else:
            _check_args(paths, batch_size)
        subset = _subset(subset)
        if ids is not None:
            if subset is not None:
                raise ValueError("both subset= and ids= given: pass one")
            subset = _ids(ids)
        filter = _filter(filter)
        # The options as the user gave them, by their spec names (spec.py,
        # generated from the daemon's one table): every default lives there.
        given = {spec.BY_KEYWORD[k]: v for k, v in (
            ("format", format), ("record_size", record_size), ("header_bytes", header_bytes),
            ("csv_header", csv_header), ("skip_crc", skip_crc), ("drop_partial", drop_partial), ("direct", direct),
            ("columns", list(columns) if columns is not None else None), ("split", split),
            ("extensions", [e if e.startswith(".") else "." + e for e in extensions] if extensions else None),
            ("subset", subset), ("filter", filter), ("dedup", dedup), ("refresh", refresh),
            ("transform", transform), ("rank", rank), ("world_size", world_size), ("drop_last", drop_last),
            ("rank_drop_last", rank_drop_last), ("prefetch", prefetch), ("depth", depth), ("memory", memory),
            ("ordered", ordered), ("sampler", sampler), ("block_size", block_size), ("window", window),
            ("buffer", buffer), ("reservoir", reservoir), ("opportunistic", opportunistic), ("share", share),
            ("batch_stride", batch_stride), ("batch_offset", batch_offset), ("min_randomness", min_randomness),
            ("auto_order", auto_order))}
        for k, v in dict(given, seed=seed, shuffle=shuffle).items():
            _check_sendable(k, v)
        self.spec = {"batch_size": batch_size, "shuffle": shuffle, "seed": seed}
        if mixture is None:
            self.spec["paths"] = [_abspath(p) for p in paths]
        else:
            self.spec["mixture"] = mixture
            if mixture_stop is not None:
                self.spec["mixture_stop"] = mixture_stop
        # None is unset; False is sent where the default may be true (direct, ordered).
        self.spec.update({k: v for k, v in given.items() if v is not None and not (v is False and spec.OPTIONS[k][4] == "false")})
        # A mixture's weights from each epoch on (set_weights adds to them).
        self._weights = _segments(mixture, mixture_history) if mixture is not None else None
        self._weights_gen = 0
        # A growing dataset's (refresh): (epoch, generations of files it reads), from the daemon or a state.
        self._generations: tuple[int, int] | None = None
        self.memory = memory
        self.dtype, self.shape = dtype, shape
        self.pipeline = max(1, pipeline)
        self.reconnect = reconnect  # seconds to wait for a daemon again after it went away
        self._version: str | None = None
        self._records: int | None = None
        # The order sampler="auto" chose, once the daemon has said.
        self.auto: dict | None = None
        self.direct = False  # the daemon reads the files with O_DIRECT: known once it has said
        if sampler == "auto" and int(world_size or 1) > 1 and auto_order is None:
            raise ValueError("sampler='auto' with world_size > 1: ranks on other nodes measure other devices and could "
                             "choose other orders. riffle.torch agrees on rank 0's choice through torch.distributed; "
                             "with riffle.Loader, open one with world_size=1, read its .auto, and give every rank its "
                             "sampler, block_size and window")
        self.epoch = epoch
        self._batch = 0
        # Positions of this epoch's order delivered before its batch 0, by
        # ranks of another topology (an elastic resume): this epoch is the
        # rest of the order, a job of its own.
        self._start = 0
        # A shared order's epoch resumed on another topology: the places of
        # the parts of the run before (or, once open, what they delivered,
        # as the daemon put it in one), whose records this epoch's job, the
        # rest of it, leaves out.
        self._delivered: list[dict] | None = None
        self._handed = False  # _delivered are the places handed, not yet the rest's basis (its job not opened)
        # The places of a rest of an epoch this loader finished, which its
        # place at the next epoch's start still carries: the rest's parts
        # were dealt from what they leave out.
        self._ended: list[dict] | None = None
        self._sampler_state: bytes | None = None
        self._skip: list[int] | None = None
        self._unresolved = False  # the sampler state of this place is still the daemon's
        # A shared job's state is the daemon's, which a daemon killed takes
        # with it: the loader keeps what rebuilds it, the state its job
        # opened from and the ids of the batches delivered since (_kept).
        self._taken: _Taken | None = None
        self._conn_args = (socket, address, token, timeout, autostart)
        # Whether the place is one load_state_dict gave, not iterated from yet (set_epoch keeps it); and the epoch
        # set_epoch asked for that the loaded place is past the end of (the next iteration delivers nothing).
        self._loaded = False
        self._over: int | None = None
        self._meta: dict | None = None
        self._held = 0
        self._job: _Job | None = None
        self._finalizer = None
        self._check()

    # --- epochs and checkpoints ---
    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at ``epoch`` (as DistributedSampler.set_epoch).

        After ``load_state_dict(state)``, until the next iteration, ``set_epoch`` of the epoch the state is in keeps
        the loaded place: the next iteration is the rest of that epoch, as a training loop that calls
        ``set_epoch(epoch)`` at each epoch's start expects when it resumes at its checkpoint's epoch. A state taken
        after an epoch's last batch is at the start of the next and at the end of that one: ``set_epoch`` of the
        epoch it ended makes an iteration of no batches, nothing of it being left, and the next iteration is the
        state's epoch. Any other epoch starts at its beginning, and the loaded place is dropped.
        """
        epoch = int(epoch)
        if self._loaded and epoch == self.epoch:
            self._over = None
            return
        if self._loaded and epoch == self.epoch - 1 and self._at_start():
            self._over = epoch
            return
        self._loaded, self._over = False, None
        self._to_epoch(epoch)

    def _to_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` from its beginning."""
        if epoch != self.epoch or self._batch or self._start or self._delivered:
            self.epoch, self._batch, self._sampler_state, self._skip = epoch, 0, None, None
            self._start, self._unresolved, self._delivered, self._ended = 0, False, None, None

    def _at_start(self) -> bool:
        """Whether this loader's place is its epoch's start: nothing of the epoch delivered."""
        return not (self._batch or self._start or self._delivered or self._sampler_state or self._skip)

    def set_weights(self, weights: Sequence[float], epoch: int | None = None) -> None:
        """A mixture's new weights, from ``epoch`` on: by default the next epoch this loader begins (this one, if
        none of it was delivered yet). Each source goes on from where the old weights left it; the change is in
        ``state_dict()``, so a resume keeps it."""
        if self._weights is None:
            raise ValueError("set_weights: this loader reads no mixture")
        if epoch is None:
            epoch = self.epoch if not (self._batch or self._start) else self.epoch + 1
        self._weights = _with_weights(self._weights, weights, int(epoch), len(self.spec["mixture"]))
        self._weights_gen += 1

    @property
    def offsets(self) -> list[int]:
        """A mixture's first id of each source: source k's record i is id ``offsets[k] + i`` in batches."""
        if self._meta is None:
            self._open()
        return list((self._meta.get("info") or {}).get("offsets") or [0])

    def _at(self, epoch: int) -> tuple[dict, int]:
        """The spec of a job opening at epoch, and the mixture's weights it has (-1: no mixture)."""
        if self._weights is None:
            return dict(self.spec), -1
        return _mixture_at(self.spec, self._weights, epoch)

    def state_dict(self) -> dict[str, Any]:
        """The place of the next batch: save it with the model's checkpoint."""
        if self._unresolved:
            self._resolve()
        st = {"epoch": self.epoch, "batch": self._batch, "seed": self.spec["seed"], "world": self._world()}
        if self._version:
            st["dataset"] = self._version  # the version of the files the place is in
        if self._positional() and int(self.spec.get("batch_stride", 1) or 1) <= 1:
            # Where the epoch is for every rank, in positions of its order:
            # after b batches of each of W ranks, the ranks together hold
            # the order's first W*b*batch_size positions (DistributedSampler's
            # stride, or a block order's runs of a batch), so any topology
            # resumes from it.
            st["position"] = self._start + self._batch * self._world() * self.spec["batch_size"]
        if self._start:
            st["start"] = self._start
        self._whose(st)
        if self._sampler_state:
            st["sampler_state"] = base64.b64encode(self._sampler_state).decode()
        if self._skip:
            st["skip"] = list(self._skip)
        if self._weights is not None:
            st["mixture_weights"] = _weights_state(self._weights)
        if self.auto is not None:
            st["order"] = dict(self.spec["auto_order"])
        if self._generations and self._generations[0] == self.epoch:
            st["generations"] = self._generations[1]  # the files this epoch reads, of a dataset that grows
        if self.spec.get("refresh"):
            st.pop("dataset", None)  # it grows by design; the daemon's log keeps each epoch's files
        return st

    def _whose(self, place: dict) -> None:
        """Put in a place of a shared or opportunistic order whose it is (and, opportunistic, in batches of which
        size, in windows of how many), and, of the rest of an epoch (or at the start of the epoch after one), the
        places it was opened from."""
        if not _restable(self.spec):
            return
        place["rank"] = int(self.spec.get("rank", 0) or 0)  # merge_states puts every rank's together
        if not _shared(self.spec):
            place.update(batch_size=int(self.spec["batch_size"]), window=int(self.spec["opportunistic"]))
        if self._delivered:
            place["rest" if self._handed else "delivered"] = list(self._delivered)
        if self._ended and not self._batch:
            place["ended"] = list(self._ended)

    def _world(self) -> int:
        return max(1, int(self.spec.get("world", 1) or 1))

    def _positional(self) -> bool:
        return _positional(self.spec)

    def _resolve(self) -> None:
        # The place came with a batch of a job whose sampler state stays in
        # the daemon: fetch it while the job still has it, or rebuild it
        # from what this loader kept (its job closed, its daemon killed).
        j = self._job
        try:
            if j is None or os.getpid() != j.conn.pid:
                raise RiffleError(
                    "this loader's sampler state is kept by its job, which is closed: "
                    "call state_dict() while iterating (or before close())")
            st = j.state(self.epoch, self._batch)
        except RiffleError:
            if not self._take_kept():
                raise
            return
        ss = st.get("sampler_state")
        self._sampler_state = base64.b64decode(ss) if ss else None
        self._skip = st.get("skip") or None
        self._unresolved = False

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a place ``state_dict()`` returned."""
        if state.get("seed", self.spec["seed"]) != self.spec["seed"]:
            raise RiffleError(f"state was saved with seed {state['seed']}, this loader has seed {self.spec['seed']}")
        if not self.spec.get("refresh"):
            _check_dataset(state, self._version)
        if state.get("order"):
            # The order sampler="auto" chose for the run that saved this: the
            # same, not a choice made again on another measure of the device.
            order = state["order"]
            if self.auto is None:
                mine = {k: self.spec.get(k) for k in ("sampler", "block_size", "window") if self.spec.get(k)}
                if mine != order:
                    raise ValueError(f"this state was saved by a loader whose sampler='auto' chose {order}; this "
                                     f"loader reads {mine or 'the global order'}: give it sampler='auto' or that order")
            else:
                self.auto = dict(self.auto, **order)
                self._pin(order)
        self._unresolved = False
        # set_epoch of the loaded place's epoch keeps it, until the next iteration (see set_epoch).
        self._loaded, self._over = True, None
        self.epoch, self._batch, self._start = int(state["epoch"]), int(state["batch"]), int(state.get("start", 0))
        self._delivered, self._ended = None, None
        world = int(state.get("world", self._world()))
        if _restable(self.spec):
            state = _own(state, self._world(), int(self.spec.get("rank", 0) or 0))
        if _restable(self.spec) and _rest(state, self._world()):
            # A shared or opportunistic order's epoch on another topology, or
            # the rest of one already: the rest of the epoch, without every
            # record the parts' places delivered (the daemon puts them
            # together).
            self.epoch, places = _rest_places(state, self._world(), int(self.spec.get("rank", 0) or 0),
                                              bool(self.spec.get("rank_drop_last")), _shared(self.spec))
            self._batch, self._delivered, self._sampler_state, self._skip = 0, places or None, None, None
            self._handed = bool(places)
            self._generations = None
            return
        if _restable(self.spec):
            _check_rank(state, int(self.spec.get("rank", 0) or 0))
        if "position" in state and self._positional():
            # Elastic: the place in this topology. A position on a boundary
            # of this topology's global batches is a batch of the whole
            # epoch's job, as if this run had got there itself; any other
            # is the rest of the epoch, from there, split over these ranks.
            pos, glob = int(state["position"]), self._world() * self.spec["batch_size"]
            self._batch, self._start = (pos // glob, 0) if pos % glob == 0 else (0, pos)
        elif world != self._world():
            raise ValueError(f"this state was saved on {world} ranks and this loader is one of {self._world()}: its "
                             "order (opportunistic over blocks) resumes only on as many; an order that is a function "
                             "of position (global, block, sequential, buffered, reservoir) resumes on any number, and "
                             "a shared or opportunistic global one from every rank's state (riffle.merge_states)")
        ss = state.get("sampler_state")
        self._sampler_state = base64.b64decode(ss) if ss else None
        self._skip = list(state["skip"]) if state.get("skip") else None
        self._generations = (self.epoch, int(state["generations"])) if state.get("generations") else None
        if state.get("mixture_weights") and self._weights is not None:
            self._weights = _state_weights(state, len(self.spec["mixture"]))
            self._weights_gen += 1

    # --- the job ---
    def _conn(self) -> Connection:
        return connect(*self._conn_args)

    def _opening(self, msg: dict) -> tuple[Connection, dict, list[int]]:
        """Send an open or a check, and its reply. The process's shared connection may be to a daemon that has
        since gone (restarted, say): an open is safe to make again on a new connection, which starts a daemon if
        none answers. An index may be built on the way, so the reply may take long."""
        conn = self._conn()
        try:
            reply, _, fds = conn.request(msg, timeout=conn.open_timeout)
        except DaemonGone:
            conn = self._conn()
            reply, _, fds = conn.request(msg, timeout=conn.open_timeout)
        return conn, reply, fds

    def _check(self) -> None:
        """Ask the daemon what opening this loader's job would answer: a bad option or path fails here, when the
        loader is built, as the exception a PyTorch user catches (ValueError, FileNotFoundError)."""
        spec, _ = self._at(self.epoch)
        spec.update(epoch=self.epoch, batch=self._batch, epochs=self._epochs())
        _, reply, fds = self._opening({"op": wire.OP_CHECK, "spec": spec})
        for fd in fds:
            os.close(fd)
        self._meta = reply
        # The loader is bound to the data as it was when it was built.
        self._version = reply.get("dataset_version")
        self._records = reply.get("records")
        # Whether the daemon reads the files with O_DIRECT: asked, or chosen for a shuffle of more than the page cache keeps.
        self.direct = bool(reply.get("direct"))
        if reply.get("auto") and self.spec.get("sampler") == "auto":
            # The order is chosen once, here: every epoch, and a resume from
            # this loader's state, reads the same one.
            self.auto = reply["auto"]
            self._pin(self.auto)

    def _pin(self, order: dict) -> None:
        """Read the order sampler="auto" chose (or a state recorded) from now on, without choosing again."""
        self.spec["auto_order"] = {k: order[k] for k in ("sampler", "block_size", "window") if order.get(k)}

    def _epochs(self) -> int:
        """Epochs a job opens for: all, unless the dataset grows (each epoch reads the files found by then)."""
        return 1 if self.spec.get("refresh") else -1

    def _place_spec(self, spec: dict) -> dict:
        """spec (of this loader's epoch) with the place a job opens at: this loader's."""
        spec.update(epoch=self.epoch, batch=self._batch, epochs=self._epochs())
        if self._generations and self._generations[0] == self.epoch:
            spec["generations"] = self._generations[1]
        if self._start:
            spec.update(start=self._start, epochs=1)  # the rest of one epoch: the next is a job of its own
        if self._delivered:
            spec.update(delivered=self._delivered, epochs=1)
        if self._sampler_state:
            spec["sampler_state"] = base64.b64encode(self._sampler_state).decode()
        if self._skip:
            spec["skip"] = self._skip
        return spec

    def left(self) -> int:
        """Batches this loader delivers from its place to its epoch's end, as the daemon counts them: the whole
        epoch's at its start, the rest of it after ``load_state_dict`` of a place inside it (``len()`` stays the
        whole epoch's)."""
        if self._over is not None:
            return 0
        if self._unresolved:
            self._resolve()  # the place's sampler state, which a check opens from
        j = self._job
        if j is not None and (j.epoch, j.batch) == (self.epoch, self._batch) and self._batch in (0, j.opened_at[1]):
            return self._left(j)
        spec, _ = self._at(self.epoch)
        _, reply, fds = self._opening({"op": wire.OP_CHECK, "spec": self._place_spec(spec)})
        for fd in fds:
            os.close(fd)
        return int(reply.get("left") or 0)

    def _open(self) -> _Job:
        """The job at this loader's place: the one kept from the last epoch if it is there, else a new one."""
        j = self._job
        spec, weights = self._at(self.epoch)
        if (j is not None and (j.epoch, j.batch, j.start, j.rest) == (self.epoch, self._batch, self._start, bool(self._delivered))
                and os.getpid() == j.conn.pid
                and j.weights == (self._weights_gen, weights) and (self._epochs() < 0 or j.opened_at[0] == self.epoch)):
            return j
        if self._unresolved and j is not None and os.getpid() == j.conn.pid:
            self._resolve()  # the new job starts from the whole state
        self.close()
        spec = self._place_spec(spec)
        conn, reply, fds = self._opening({"op": wire.OP_OPEN, "spec": spec})
        mm, arena = None, None
        if reply.get("arena_size"):
            if not fds:
                raise RiffleError("the daemon sent no shared memory with the job")
            try:
                mm = mmap.mmap(fds[0], reply["arena_size"], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                arena = fds.pop(0)  # kept for lending batches (Loader.lend)
            finally:
                for fd in fds:
                    os.close(fd)
        if reply.get("delivered"):
            # What the places delivered, as one: the rest's states carry it.
            self._delivered = [{"epoch": self.epoch, "batch": 0, "sampler_state": reply["delivered"]}]
            self._handed = False
        self._job = _Job(conn, reply, mm, self.epoch, self._batch, self._start, arena)
        # A job of a mixture reads with one epoch's weights: at a change, the next epoch is a job of its own.
        self._job.weights = (self._weights_gen, weights)
        self._finalizer = weakref.finalize(self, _close_job, self._job)
        if reply.get("generations"):
            self._generations = (self.epoch, int(reply["generations"]))
        if self._version and reply.get("dataset_version") != self._version and not self.spec.get("refresh"):
            # The rule: a loader reads the data as it was when it was built.
            # Files added, removed or rewritten since change the samples
            # and, in an ImageFolder, the classes: say so, never go on.
            was, now = self._records, reply.get("records")
            self.close()
            raise DataChanged(f"the dataset changed since this loader was built ({was} records then, {now} now; "
                              "files were added, removed or rewritten): build a new loader to read it as it is now",
                              (self.spec.get("paths") or [None])[0])
        self._meta = reply
        return self._job

    def close(self) -> None:
        """End the daemon's job for this loader (a later iteration opens another)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._job = None

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def info(self) -> dict:
        """The dataset's description: format, record size, dtype and shape, classes, paths; plus counts."""
        if self._meta is None:
            self._open()
        m = self._meta
        return dict(m.get("info") or {}, records=m.get("records", 0), positions=m.get("positions", 0),
                    batches=m.get("batches", 0), samples=m.get("samples", 0))

    def __len__(self) -> int:
        """Batches per epoch for this loader (this rank, and this worker's share)."""
        return int(self.info()["batches"])

    def locate(self, ids: Sequence[int]) -> list[tuple[str, int]]:
        """Where records are: (file, byte offset) of each id, for naming a record in an error."""
        j = self._open()
        reply, _, _ = j.conn.request({"op": wire.OP_LOCATE, "job": j.id, "ids": [int(i) for i in ids]})
        return list(zip(reply.get("paths") or [], reply.get("offsets") or [0] * len(ids)))

    def _left(self, j: "_Job") -> int:
        """How many batches the job delivers from this loader's place to the epoch's end, as the daemon counts."""
        if (self.epoch, self._batch) == j.opened_at:
            return j.left_first
        if self._batch == 0:
            return j.per_epoch
        raise RiffleError(f"the job opened at {j.opened_at} cannot say how many batches follow "
                          f"epoch {self.epoch} batch {self._batch}")

    def __iter__(self) -> Iterator[Batch]:
        """The batches of this epoch (the loader's place to the epoch's end).

        If the daemon goes away mid-epoch (killed, restarted), the loader
        reconnects, starting a daemon if none answers, reopens its job at
        the place after the last batch it delivered and goes on: each
        record exactly once. A shared job's state, which was the daemon's,
        it rebuilds from the ids of the batches it delivered. It raises
        DaemonGone only when no daemon answers within ``reconnect`` seconds,
        or when its shared order's state went with the daemon and cannot be
        rebuilt from what the loader delivered (opportunistic windows, a
        mixture, the rest of an epoch on another topology).
        """
        if self._over is not None:
            self._over = None  # the epoch set_epoch asked for ended at the loaded place
            return
        self._loaded = False
        epoch = self.epoch
        while True:
            try:
                yield from self._batches()
                return
            except DaemonGone as gone:
                if not self._recover(gone):
                    raise
                if self.epoch != epoch:
                    return  # the epoch's last batch was delivered before the daemon went

    def _recover(self, gone: DaemonGone) -> bool:
        """Reconnect after the daemon went; False if this loader cannot go on exactly."""
        self._job = None
        if self._unresolved and self.reconnect > 0:
            self._take_kept()
        if self._unresolved or self.reconnect <= 0:
            if self._unresolved:
                gone.args = (f"{gone}; this loader's shared order kept its state in the daemon, which went with it "
                             "(a shared order's opportunistic windows, mixture or rest of an epoch on another topology "
                             "are not rebuilt from what the loader delivered): resume from a checkpoint "
                             "(load_state_dict) to go on",)
            return False
        deadline = time.monotonic() + self.reconnect
        while True:
            try:
                self._open()
                return True
            except DaemonGone:
                if time.monotonic() >= deadline:
                    raise DaemonGone(f"the riffle daemon went away and none answered again within "
                                     f"{self.reconnect}s (Loader(reconnect=...))") from None
                time.sleep(0.1)

    def _keeps(self) -> bool:
        """Whether this loader keeps what rebuilds its job's state: a shared order that delivers each batch whole
        (not opportunistic, not a mixture's, not the rest of an epoch on another topology)."""
        return (_shared(self.spec) and int(self.spec.get("opportunistic") or 1) <= 1 and not self.spec.get("mixture")
                and not self._delivered and not self._start)

    def _kept(self, taken: _Taken | None = None, n: int = 0, epoch: int = 0) -> bytes | None:
        """The shared job's state at this place (or after the first n batches of taken, a place of epoch), as the
        loader kept it; b"" at an epoch's start; None if it kept none of the place."""
        if taken is None:
            taken, epoch = self._taken, self.epoch
            n = taken.count if taken is not None else 0
        positions = int((self._meta or {}).get("positions") or 0)  # the job's records an epoch: its member's
        if taken is None or taken.epoch != epoch or not positions:
            return None
        return taken.state(positions, n)

    def _take_kept(self) -> bool:
        """Make this place's state the one the loader kept (its daemon, or its job, went); False if it kept none."""
        kept = self._kept()
        if kept is None:
            return False
        self._sampler_state, self._skip, self._unresolved = kept or None, None, False
        return True

    def _batches(self) -> Iterator[Batch]:
        j = self._open()
        if j.stream and self._keeps():
            self._taken = _Taken(self.epoch, self._sampler_state if self._batch else None)
        else:
            self._taken = None
        conn, job, info = j.conn, j.id, j.reply.get("info") or {}
        conn_ref = weakref.ref(conn)
        # Up to `pipeline` requests stay ahead of the user, so the next
        # batches' round trips overlap the training step on this one; none
        # goes past this epoch, so the job stays at the next epoch's start.
        # They go `chunk` (half the pipeline) at a time, in one write with the releases queued
        # since the last: each write wakes the daemon, which costs more
        # than the bytes.
        left = self._left(j)
        chunk = max(1, self.pipeline // 2)
        nxt = {"op": wire.OP_NEXT, "job": job}
        tags: collections.deque[int] = collections.deque()
        size = 0  # bytes of the last batch: the estimate for those in flight
        done = False
        try:
            while left > 0 or tags:
                # Until a batch's size is known, one request at a time.
                cap = self.pipeline if size else 1
                if j.lent:
                    self._take_back(j)
                if not tags or len(tags) <= cap - chunk:
                    k = 0
                    while k < left and len(tags) + k < cap and self._room(size * (len(tags) + k + 1)):
                        k += 1
                    if k:
                        tags.extend(conn.send_many([nxt] * k))
                        left -= k
                if not tags:
                    self._wait_for_memory(size)  # raises: held batches fill the job's memory
                    continue
                try:
                    m, payload, _ = conn.receive(tags.popleft())
                except DaemonGone:
                    tags.clear()
                    _forget(conn)
                    self._job = None
                    raise
                if m["op"] == wire.OP_END:
                    break
                self._advance(m.get("state") or {}, m, j.stream)
                j.epoch, j.batch = self.epoch, self._batch
                batch = self._batch_from(m, payload, j.mm, info, conn_ref, job)
                size = max(size, m.get("data_len", 0))
                yield batch
                del batch
            done = True
        finally:
            if not done or tags:
                # Stopped mid-epoch: the daemon's place is ahead of ours.
                for tag in tags:
                    conn.drop(tag)
                if self._unresolved:
                    try:
                        self._resolve()  # the job holding the sampler state is closing
                    except (RiffleError, OSError):
                        pass
                self.close()

    def _advance(self, st: dict, m: dict, stream: bool = False) -> None:
        epoch = self.epoch
        self.epoch, self._batch = int(st.get("epoch", m["epoch"])), int(st.get("batch", m["index"] + 1))
        if self.epoch != epoch:
            # The rest of an epoch was one epoch; the next one's start still says what it was dealt from.
            self._ended = self._delivered
            self._start, self._delivered = 0, None
        ss = st.get("sampler_state")
        self._sampler_state = base64.b64decode(ss) if ss else None
        self._skip = st.get("skip") or None
        self._unresolved = stream

    def _batch_from(self, m, payload, mm, info, conn_ref, job) -> Batch:
        n = m.get("n", 0)
        buf = mm if mm is not None else payload
        k = 4 if m.get("labels") else 3
        arrow = m.get("arrow")
        extra = 2 * (arrow["nodes"] + arrow["buffers"]) if arrow else 0
        meta = np.frombuffer(buf, np.int64, count=n * k + extra, offset=m.get("meta_off", 0)).copy()
        ids, offs, lens = meta[:n], meta[n : 2 * n], meta[2 * n : 3 * n]
        labels = meta[3 * n : 4 * n] if m.get("labels") else None
        if self._taken is not None:
            if self._taken.epoch != self.epoch:
                self._taken = _Taken(self.epoch, None)  # the place is the next epoch's start
            if m["epoch"] == self.epoch:
                self._taken.add(ids)
        size = m.get("data_len", 0)
        raw = np.frombuffer(buf, np.uint8, count=size, offset=m.get("data_off", 0))
        fin = None
        if mm is not None:
            self._held += size
            fin = weakref.finalize(raw, _give_back, conn_ref, job, m["seq"], self, size)
        state = self._place_state()
        b = Batch(m["epoch"], m["index"], bool(m.get("last")), ids, offs, lens, labels, raw, info, self.dtype,
                  self.shape, state)
        if fin is not None:
            b._lease = (self._job, m["seq"], m.get("data_off", 0), fin)
        if arrow:
            table = meta[n * k :].reshape(-1, 2)
            b._table = (int(arrow["body"]), table[: arrow["nodes"]], table[arrow["nodes"] :])
        return b

    def _place_state(self):
        """The state after the batch just received, or, if the daemon keeps its sampler state, a function asking for it."""
        if not self._unresolved:
            return self.state_dict()
        j, place = self._job, {"epoch": self.epoch, "batch": self._batch, "seed": self.spec["seed"]}
        self._whose(place)
        taken = self._taken
        n = taken.count if taken is not None else 0

        def ask() -> dict:
            try:
                st = j.state(place["epoch"], place["batch"])
            except DaemonGone:
                # The daemon went with the job's state: the one kept here.
                kept = self._kept(taken, n, place["epoch"]) if taken is not None else None
                if kept is None:
                    raise
                st = {"sampler_state": base64.b64encode(kept).decode() if kept else None}
            out = dict(place)
            if st.get("sampler_state"):
                out["sampler_state"] = st["sampler_state"]
            if st.get("skip"):
                out["skip"] = list(st["skip"])
            return out
        return ask

    # --- lending batches to another process ---
    def lend(self, batch: Batch) -> tuple[str, Any, Any, int, int] | None:
        """Hand ``batch``'s memory over to another process (a DataLoader worker's batch to the main process),
        without a copy: None if it cannot be (no shared memory, or the batch was already given back).

        Returns ``(key, arena, returns, data_off, seq)``: the other process maps the job's arena (``arena``,
        a ``multiprocessing.reduction.DupFd`` the first time a job lends, else None: the borrower keeps the
        mapping by ``key``) and views the batch at ``data_off``; when it is done with the batch it writes
        ``seq`` (8 bytes, little-endian) to ``returns`` (likewise a DupFd of a pipe the first time). From the
        lend on, the batch's region stays the daemon's to keep for the borrower, whatever this process drops:
        it is given back only when the borrower writes its seq, or when this process's job closes (the daemon
        then keeps the pages of batches not given back, so the borrower's view stays valid; a later give-back
        finds the pipe closed). This loader reads what came back before each request.
        """
        lease = getattr(batch, "_lease", None)
        if lease is None:
            return None
        j, seq, data_off, fin = lease
        if j is None or j.fd is None or not fin.alive:
            return None
        from multiprocessing.reduction import DupFd
        arena = returns = None
        if j.returns is None:
            r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            j.returns, j.key = r, f"{os.getpid()}-{id(j)}-{os.urandom(4).hex()}"
            arena, returns = DupFd(j.fd), DupFd(w)  # each holds a duplicate until the borrower takes it
            os.close(w)
        _, _, args, _ = fin.detach()
        j.lent[seq] = args
        batch._lease = None
        return j.key, arena, returns, data_off, seq

    def _take_back(self, j: _Job) -> None:
        """Give back to the daemon the lent batches the borrower is done with."""
        if j.returns is None or not j.lent:
            return
        while True:
            try:
                got = os.read(j.returns, 8 << 10)
            except BlockingIOError:
                return
            if not got:
                return
            for (seq,) in struct.iter_unpack("<Q", got[: len(got) // 8 * 8]):
                args = j.lent.pop(seq, None)
                if args is not None:
                    _give_back(*args)

    def _bound(self) -> int | None:
        """The job's memory bound: ``memory=``, or the one the daemon chose (it says in its answer to the check)."""
        return self.memory or (self._meta or {}).get("memory_bytes") or None

    def _room(self, next_bytes: int) -> bool:
        bound = self._bound()
        return bound is None or self._held + next_bytes <= bound

    def _wait_for_memory(self, next_bytes: int) -> None:
        # The daemon cannot load a batch while held batches fill the job's
        # memory; say so instead of waiting forever.
        if self._room(next_bytes):
            return
        if self._job is not None and self._job.lent:
            # A borrower may have given batches back since the last request.
            deadline = time.monotonic() + 5.0
            while not self._room(next_bytes) and self._job.lent and time.monotonic() < deadline:
                self._take_back(self._job)
                if not self._room(next_bytes):
                    time.sleep(0.001)
            if self._room(next_bytes):
                return
        gc.collect()
        if not self._room(next_bytes):
            raise MemoryBudget(
                f"{self._held} bytes of batches are still referenced, the job's whole memory ({self._bound()} bytes): "
                "drop references to old batches, or raise memory=")
