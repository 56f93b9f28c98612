"""riffle's errors, one class for each kind of error frame (wire.KIND_*): each is also the built-in exception
a PyTorch user catches (a bad option is a ``ValueError``, a missing path a ``FileNotFoundError``)."""

from __future__ import annotations

import errno
import re
from typing import Any

from . import wire


class RiffleError(Exception):
    """An error from riffle; ``path`` and ``offset`` say where in the data, if known."""

    def __init__(self, message: str, path: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.path = path
        self.offset = offset


class InvalidSpec(RiffleError, ValueError):
    """An argument the daemon refuses (an option out of bounds, a format it cannot read): also a ``ValueError``."""


class WrongType(InvalidSpec, TypeError):
    """An option's value of a type riffle cannot send (an object where it takes a name or a number): an
    :class:`InvalidSpec`, and the ``TypeError`` Python raises for an argument of the wrong type."""


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
    wire.KIND_INTERNAL: RiffleError,  # the daemon's own failure
}


def error_from(reply: dict[str, Any]) -> RiffleError:
    """The exception an error frame stands for."""
    cls = _KINDS.get(reply.get("kind") or "", RiffleError)
    return cls(reply.get("message", "error"), reply.get("path") or None, reply.get("offset"))


class UnsafeSocket(RiffleError):
    """The socket's directory, or the daemon behind it, is not this user's."""


class RecordError(RiffleError):
    """Decoding or transforming a record failed; names the record, its file and offset."""

    def __init__(self, message: str, record: int | None = None, path: str | None = None, offset: int | None = None):
        if record is None:
            # Made again from its message alone: DataLoader re-raises a worker's exception in the main process as
            # its type called with the message (its traceback's text), which names them as _record_error wrote.
            # The last match: the traceback's last line is this error's, after those of its causes.
            m = ([None] + list(re.finditer(r"record (\d+)(?: \((.*) at offset (\d+)\))?: ", message)))[-1]
            if m:
                record, path, offset = int(m[1]), m[2], None if m[3] is None else int(m[3])
        super().__init__(message, path, offset)
        self.record = record
