"""The daemon's life: clients that die, a daemon that dies, several
clients, starting on demand, path roots, TCP with a token."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import riffle
from riffle import client

from conftest import REPO, Daemon, write_fixed, free_port

CLIENT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {py!r})
    import riffle
    ld = riffle.Loader({path!r}, batch_size=50, record_size=64, seed={seed})
    ids = []
    for b in ld:
        ids += b.ids.tolist()
        print("batch", flush=True)
        time.sleep({sleep})
    assert sorted(ids) == list(range(1000)), "not exactly once"
    print("ok", len(ids), flush=True)
""")


def spawn_client(sock: str, path, seed: int = 0, sleep: float = 0.0) -> subprocess.Popen:
    code = CLIENT.format(py=str(REPO / "python"), path=str(path), seed=seed, sleep=sleep)
    env = dict(os.environ, RIFFLE_SOCKET=sock)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)


def wait_jobs(d: Daemon, want: int, within: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < within:
        if d.stats().get("jobs", 0) == want:
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"daemon still has {d.stats().get('jobs', 0)} jobs after {within}s, want {want}")


def test_two_clients_at_once(daemon, fixed_file):
    a = spawn_client(daemon.sock, fixed_file, seed=1, sleep=0.01)
    b = spawn_client(daemon.sock, fixed_file, seed=2, sleep=0.01)
    for p in (a, b):
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert "ok 1000" in out


def test_killed_client_frees_its_job_and_others_go_on(tmp_path, fixed_file):
    d = Daemon(str(tmp_path / "k.sock"))
    try:
        victim = spawn_client(d.sock, fixed_file, sleep=0.2)
        assert victim.stdout.readline().strip() == "batch"  # mid-epoch
        assert d.stats()["jobs"] == 1
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        took = wait_jobs(d, 0, within=1.0)
        assert took < 1.0
        other = spawn_client(d.sock, fixed_file)
        out, err = other.communicate(timeout=60)
        assert other.returncode == 0 and "ok 1000" in out, err
    finally:
        d.stop()


def test_killed_daemon_is_a_clear_error(tmp_path, fixed_file, monkeypatch):
    # With no reconnection asked (reconnect=0), at once.
    d = Daemon(str(tmp_path / "d.sock"))
    monkeypatch.setenv("RIFFLE_SOCKET", d.sock)
    ld = riffle.Loader(fixed_file, batch_size=10, record_size=64, timeout=5, autostart=False, reconnect=0)
    it = iter(ld)
    next(it)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    start = time.monotonic()
    with pytest.raises(riffle.DaemonGone, match="daemon"):
        for _ in it:
            pass
    assert time.monotonic() - start < 5
    d.stop()


def test_a_new_loader_after_a_daemon_restart(tmp_path, fixed_file, monkeypatch):
    # The process's shared connection went with the first daemon (with
    # releases still queued on it): the next loader opens on a new one.
    d = Daemon(str(tmp_path / "d.sock"))
    monkeypatch.setenv("RIFFLE_SOCKET", d.sock)
    ld = riffle.Loader(fixed_file, batch_size=10, record_size=64, timeout=5, autostart=False)
    held = [b for b, _ in zip(ld, range(3))]
    ld.close()
    del held
    d.stop()
    d = Daemon(str(tmp_path / "d.sock"))
    try:
        ld = riffle.Loader(fixed_file, batch_size=10, record_size=64, timeout=5, autostart=False)
        assert sorted(i for b in ld for i in b.ids.tolist()) == list(range(1000))
    finally:
        d.stop()


def test_daemon_that_stops_answering_times_out(tmp_path, fixed_file, monkeypatch):
    d = Daemon(str(tmp_path / "s.sock"))
    monkeypatch.setenv("RIFFLE_SOCKET", d.sock)
    ld = riffle.Loader(fixed_file, batch_size=10, record_size=64, timeout=1, autostart=False, reconnect=0)
    it = iter(ld)
    next(it)
    d.proc.send_signal(signal.SIGSTOP)
    while "T (stopped)" not in open(f"/proc/{d.proc.pid}/status").read():
        time.sleep(0.01)
    try:
        start = time.monotonic()
        with pytest.raises(riffle.DaemonGone, match="within"):
            for _ in range(3):  # the first may already be on its way
                next(it)
        assert time.monotonic() - start < 3
    finally:
        d.proc.send_signal(signal.SIGCONT)
        d.stop()


def test_client_starts_a_daemon(tmp_path, fixed_file, monkeypatch):
    sock = str(tmp_path / "auto" / "riffle.sock")
    monkeypatch.setenv("RIFFLE_SOCKET", sock)
    try:
        ids = [i for b in riffle.Loader(fixed_file, batch_size=100, record_size=64) for i in b.ids.tolist()]
        assert sorted(ids) == list(range(1000))
        assert os.stat(sock).st_mode & 0o777 == 0o600
        # A second client shares the daemon the first one started.
        c = client.Connection(sock, autostart=False)
        assert c.request({"op": "stats"})[0]["clients"] >= 1
        c.close()
    finally:
        subprocess.run(["pkill", "-f", "--", f"--socket {sock}"])


def test_roots_confine_paths(tmp_path, monkeypatch):
    inside = tmp_path / "data"
    inside.mkdir()
    good = write_fixed(inside / "a.bin", 10, 64)
    bad = write_fixed(tmp_path / "b.bin", 10, 64)
    (inside / "link.bin").symlink_to(bad)
    d = Daemon(str(tmp_path / "r.sock"), "--root", str(inside))
    monkeypatch.setenv("RIFFLE_SOCKET", d.sock)
    try:
        assert len([b for b in riffle.Loader(good, batch_size=5, record_size=64)]) == 2
        for p in (bad, inside / "link.bin", inside / ".." / "b.bin"):
            with pytest.raises(riffle.RiffleError, match="outside the allowed roots"):
                next(iter(riffle.Loader(p, batch_size=5, record_size=64)))
    finally:
        d.stop()


def test_tcp_with_token(tmp_path, fixed_file):
    port = free_port()
    d = Daemon(str(tmp_path / "t.sock"), "--tcp", f"127.0.0.1:{port}", "--token", "s3cret")
    try:
        data = fixed_file.read_bytes()
        ld = riffle.Loader(fixed_file, batch_size=128, record_size=64, address=f"127.0.0.1:{port}", token="s3cret")
        ids = []
        for b in ld:
            arr = riffle.decode.fixed(b)
            for i, rid in enumerate(b.ids):
                assert arr[i].tobytes() == data[rid * 64 : (rid + 1) * 64]
            ids += b.ids.tolist()
        assert sorted(ids) == list(range(1000))
        with pytest.raises(riffle.RiffleError, match="token"):
            riffle.Loader(fixed_file, batch_size=8, record_size=64, address=f"127.0.0.1:{port}", token="wrong").info()
    finally:
        d.stop()


def test_tcp_always_needs_a_token(tmp_path, fixed_file, monkeypatch):
    # Loopback is no trust boundary: a daemon given no token makes one and
    # writes it next to its socket, mode 0600, where only its user reads it.
    port = free_port()
    d = Daemon(str(tmp_path / "t.sock"), "--tcp", f"127.0.0.1:{port}")
    try:
        tok = tmp_path / "t.sock.token"
        assert tok.stat().st_mode & 0o777 == 0o600
        with pytest.raises(riffle.RiffleError, match="token"):
            riffle.Loader(fixed_file, batch_size=8, record_size=64, address=f"127.0.0.1:{port}", token="guess").info()
        monkeypatch.setenv("RIFFLE_SOCKET", d.sock)  # the token is found next to the default socket
        assert riffle.Loader(fixed_file, batch_size=8, record_size=64, address=f"127.0.0.1:{port}").info()["records"] == 1000
    finally:
        d.stop()


def test_a_checkout_builds_its_daemon_the_projects_one_way(tmp_path):
    """With no RIFFLE_BIN, no binary in the package and no riffle on PATH, the client of a checkout builds its
    bin/riffle through scripts/build-daemon, with the build tags this machine takes (libjpeg-turbo's decoder where
    it is installed), not a plain go build without them. A copy of the checkout, built for real: the go command
    on its PATH notes what it is asked before running."""
    import shutil
    co, gobin = tmp_path / "checkout", tmp_path / "gobin"
    co.mkdir()
    gobin.mkdir()
    # The checkout's files as they are now (tracked ones: bin/ and .venv are not).
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-C", str(REPO), "--null", "-T", "-", "-c"], input=files, check=True,
                   stdout=open(tmp_path / "co.tar", "wb"))
    subprocess.run(["tar", "-C", str(co), "-x", "-f", str(tmp_path / "co.tar")], check=True)
    go = shutil.which("go") or "/usr/local/go/bin/go"
    log = tmp_path / "go.log"
    (gobin / "go").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {go} "$@"\n')
    (gobin / "go").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("RIFFLE_BIN", "GO", "RIFFLE_TAGS")}
    env["PATH"] = f"{gobin}:/usr/bin:/bin"
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                          "from riffle.client import find_binary; print(find_binary())", str(co / "python")],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(co / "bin" / "riffle") and (co / "bin" / "riffle").exists()
    tags = subprocess.run([str(REPO / "scripts" / "go-tags")], capture_output=True, text=True).stdout.strip()
    builds = [line for line in log.read_text().splitlines() if line.startswith("build ")]
    assert builds and all(f"-tags {tags} " in b for b in builds), builds
    assert "built the daemon" in out.stderr  # build-daemon's own word
    assert subprocess.run([str(co / "bin" / "riffle"), "--help"], capture_output=True).returncode == 0
