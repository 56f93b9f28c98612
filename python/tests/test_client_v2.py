"""The client's protocol-2 behaviour: exact resume for stream samplers,
one daemon job across epochs, locating records, replies out of order, and
refusing a socket directory or daemon that is not this user's."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

import riffle
from riffle import client

from conftest import REPO, Daemon, write_fixed


def batches(ld) -> list[list[int]]:
    return [b.ids.tolist() for b in ld]


@pytest.mark.parametrize("kw", [
    {"sampler": "buffered", "buffer": 100},
    {"sampler": "buffered", "buffer": 10000},  # a state the daemon keeps until asked
    {"sampler": "reservoir", "reservoir": 200},
    {"sampler": "block", "block_size": 4096, "window": 2},
    {},
])
def test_resume_is_exact_for_every_sampler(daemon, fixed_file, kw):
    whole = batches(riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=8, **kw))
    for stop in (1, 5, 12):
        ld = riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=8, **kw)
        it = iter(ld)
        head = [next(it).ids.tolist() for _ in range(stop)]
        state = json.loads(json.dumps(ld.state_dict()))  # through a checkpoint
        it.close()
        again = riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=8, **kw)
        again.load_state_dict(state)
        assert head + batches(again) == whole, f"stopped after {stop}"


@pytest.mark.parametrize("ask", ["iterating", "after break", "after close"])
def test_shared_job_resumes_exactly_once(daemon, fixed_file, ask):
    # A shared job's sampler state (its delivered set) stays in the daemon
    # until a checkpoint asks for it: while iterating, or after the loop
    # broke off, which closes the job; asked after the loader closed its
    # job, it is the one the loader kept of what it delivered.
    ld = riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=8, share=True)
    seen = []
    it = iter(ld)
    for b in it:
        seen += b.ids.tolist()
        if len(seen) == 5 * 64:
            if ask == "iterating":
                state = json.loads(json.dumps(ld.state_dict()))
            elif ask == "after close":
                ld.close()
                state = json.loads(json.dumps(ld.state_dict()))
                assert base64.b64decode(state["sampler_state"]).startswith(b"RFBIT1")
            break
    if ask == "after break":
        state = json.loads(json.dumps(ld.state_dict()))
    assert state["batch"] == 5 and state.get("sampler_state"), state
    ld.close()
    again = riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=8, share=True)
    again.load_state_dict(state)
    seen += [i for b in again for i in b.ids.tolist()]
    assert sorted(seen) == list(range(1000))
    # The next epoch is whole again.
    assert sorted(i for b in again for i in b.ids.tolist()) == list(range(1000))


def test_opportunistic_resume_is_exactly_once(daemon, fixed_file):
    ld = riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=8, opportunistic=3)
    it = iter(ld)
    seen = [i for _ in range(4) for i in next(it).ids.tolist()]
    state = ld.state_dict()
    it.close()
    again = riffle.Loader(fixed_file, batch_size=64, record_size=64, seed=8, opportunistic=3)
    again.load_state_dict(state)
    seen += [i for b in again for i in b.ids.tolist()]
    assert sorted(seen) == list(range(1000))


def test_one_job_across_epochs(tmp_path, fixed_file, monkeypatch):
    d = Daemon(str(tmp_path / "e.sock"))
    monkeypatch.setenv("RIFFLE_SOCKET", d.sock)
    try:
        ld = riffle.Loader(fixed_file, batch_size=100, record_size=64, seed=1)
        job = None
        for epoch in range(3):
            ids = [i for b in ld for i in b.ids.tolist()]
            assert sorted(ids) == list(range(1000))
            assert ld._job is not None
            job = job or ld._job.id
            assert ld._job.id == job, "a new job for the next epoch"
            assert d.stats()["jobs"] == 1
        ld.close()
        import time
        for _ in range(100):
            if d.stats().get("jobs", 0) == 0:
                break
            time.sleep(0.02)
        assert d.stats().get("jobs", 0) == 0
    finally:
        d.stop()


def test_locate_names_the_file(daemon, tmp_path):
    root = tmp_path / "tree"
    for c in "ab":
        (root / c).mkdir(parents=True)
        for i in range(3):
            (root / c / f"{i}.bin").write_bytes(bytes(10))
    ld = riffle.Loader(root, batch_size=6, shuffle=False)
    assert ld.locate([0, 4]) == [(str(root / "a" / "0.bin"), 0), (str(root / "b" / "1.bin"), 0)]
    p = write_fixed(tmp_path / "f.bin", 10, 64)
    assert riffle.Loader(p, batch_size=5, record_size=64).locate([3]) == [(str(p), 192)]


def test_growing_records_and_small_memory_do_not_hang(daemon, tmp_path):
    # Several requests ahead, 2 MiB of memory and records that grow: the
    # daemon once waited for memory with releases stuck behind, and the
    # client timed out with two jobs leaked.
    p = tmp_path / "grow.jsonl"
    with open(p, "w") as f:
        for i in range(3000):
            f.write(json.dumps({"id": i, "pad": "x" * (i * 3)}) + "\n")
    ld = riffle.Loader(p, batch_size=64, memory=2 << 20, pipeline=4, timeout=20, shuffle=False)
    n = sum(b.n for b in ld)
    assert n == 3000
    ld.close()


def test_unsafe_socket_directory_is_refused(tmp_path, fixed_file, monkeypatch):
    d = tmp_path / "open"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    monkeypatch.setenv("RIFFLE_SOCKET", str(d / "riffle.sock"))
    with pytest.raises(client.UnsafeSocket, match="mode"):
        riffle.Loader(fixed_file, batch_size=8, record_size=64).info()


def test_a_daemon_of_another_user_is_refused(tmp_path, fixed_file, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a listener as another user")
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    sock = run / "riffle.sock"
    # A listener that is not ours: bound here, then run as nobody.
    code = textwrap.dedent(f"""
        import os, socket, time
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind({str(sock)!r})
        os.chmod({str(sock)!r}, 0o777)
        os.setgid(65534); os.setuid(65534)
        s.listen(4)
        print("listening", flush=True)
        c, _ = s.accept()
        time.sleep(5)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "listening"
        monkeypatch.setenv("RIFFLE_SOCKET", str(sock))
        with pytest.raises(client.UnsafeSocket, match="uid 65534"):
            riffle.Loader(fixed_file, batch_size=8, record_size=64, autostart=False).info()
    finally:
        p.kill()
        p.wait()
