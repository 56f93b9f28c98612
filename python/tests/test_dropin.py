"""DataLoader's idioms as a script ported to riffle.torch meets them: each
taken as DataLoader takes it, or refused at construction by name with the
fix, never a TypeError from deep inside."""

from __future__ import annotations

import os

import pytest

import riffle
from riffle import client


def test_a_daemon_that_fails_at_start_fails_the_client_with_its_log(tmp_path, fixed_file, monkeypatch):
    """A daemon that exits at start (here: its socket's path is longer than a Unix socket's may be, so it cannot
    listen) fails the client as soon as it exits, with its exit status and the last lines of its log; it waited
    30 s and then said only "did not start"."""
    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    sock = str(d / ("x" * 120 + ".sock"))
    monkeypatch.setenv("RIFFLE_SOCKET", sock)
    with pytest.raises(riffle.RiffleError) as e:
        riffle.Loader(str(fixed_file), 10, record_size=64)
    msg = str(e.value)
    assert "exited with status 1 before it answered" in msg, msg
    assert "bind: invalid argument" in msg, msg  # the daemon's own last words, from its log
