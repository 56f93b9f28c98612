"""Abandon chaos: clients that go away at random moments, the way users' processes do (killed mid-open, Ctrl-C
mid-batch, killed while holding batches, a DataLoader worker killed while it opens, connections closed 0-4 ms after
their open), against one daemon. Afterwards the daemon is idle: no job in its status, no memory held in its
budget, no client counted, every connection place free; and SIGTERM stops it."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import riffle
from riffle import client

from conftest import REPO, Daemon, status, write_fixed

CLIENT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {py!r})
    import riffle
    role, path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "workers":
        import numpy as np
        import riffle.torch as rt
        dl = rt.loader(path, 64, record_size=64, dtype=np.int64, shape=(8,), num_workers=2, seed=seed, autostart=False)
        it = iter(dl)
        print("opening", flush=True)  # the workers are forked, and open their jobs, from here
        for b in it:
            print("batch", flush=True)
    elif role == "abandon":
        # Connections of this process that close 0 to 4 ms after asking for a job.
        import random
        spec = {{"paths": [path], "record_size": 64, "batch_size": 64, "shuffle": True, "seed": seed, "epochs": -1}}
        for i in range(100):
            c = riffle.client.Connection(autostart=False)
            c.send({{"op": "open", "spec": spec}})
            time.sleep(random.random() * 0.004)
            c.close()
        print("done", flush=True)
    else:
        ld = riffle.Loader(path, 64, record_size=64, seed=seed, pipeline=4, autostart=False)
        it = iter(ld)
        print("opening", flush=True)  # the job opens at the first batch
        held = []
        for b in it:
            if role == "hold":
                held.append(b)
            print("batch", flush=True)
            time.sleep(0.002)
""")

N = 20000


def spawn(sock: str, role: str, path, seed: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLIENT.format(py=str(REPO / "python")), role, str(path), str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, RIFFLE_SOCKET=sock))


def children(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(c) for c in open(f"/proc/{pid}/task/{tid}/children").read().split()]
        except OSError:
            pass
    return out


def abandon(p: subprocess.Popen, role: str, rng: random.Random) -> None:
    """Wait for the client's moment, then end it (or one of its DataLoader workers) as its role says."""
    want = {"open-kill": "opening", "open-int": "opening", "workers": "opening", "batch-int": "batch",
            "batch-kill": "batch", "hold": "batch"}.get(role)
    if want is None:
        return
    skip = rng.randrange(5) if want == "batch" else 0
    for line in p.stdout:
        if line.strip() == want:
            if skip == 0:
                break
            skip -= 1
    else:
        return  # it ended first
    time.sleep(rng.random() * 0.005 if want == "opening" else 0)
    if role == "workers":
        deadline = time.monotonic() + 5
        while not children(p.pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        kids = children(p.pid)
        if kids:
            os.kill(rng.choice(kids), signal.SIGKILL)
        return
    os.kill(p.pid, signal.SIGINT if role.endswith("int") else signal.SIGKILL)


def idle(sock: str) -> str:
    """'' when the daemon holds nothing for anyone (the one connection asking counted), else what it holds."""
    try:
        st = status(sock)
    except riffle.DaemonGone as e:  # refused: every place on the socket is taken, for now
        return str(e)
    jobs = sum(len(g["jobs"] or []) for g in st["groups"] or [])
    mem = st["memory"]
    if jobs or st["clients"] != 1 or mem["held"] or mem["holders"] or mem.get("waiting"):
        return f"{jobs} jobs, {st['clients']} clients, {mem['held']} bytes held by {mem['holders']} jobs, {len(mem.get('waiting') or [])} opens waiting"
    return ""


def test_abandoned_jobs_leave_the_daemon_idle(tmp_path):
    places = 24
    d = Daemon(str(tmp_path / "s.sock"), "--max-conns", str(places), "--memory", "2GiB")
    path = write_fixed(tmp_path / "d.bin", N, 64)
    rng = random.Random(46)
    roles = ["open-kill", "open-int", "batch-int", "batch-kill", "hold", "workers"] * 3 + ["abandon"] * 2
    rng.shuffle(roles)
    try:
        procs, waiters = [], []
        for i, role in enumerate(roles):
            p = spawn(d.sock, role, path, i)
            procs.append(p)
            t = threading.Thread(target=abandon, args=(p, role, random.Random(rng.random())))
            t.start()
            waiters.append(t)
            if i % 4 == 3:  # at most a few at a time: the machine is shared
                for t in waiters:
                    t.join(60)
                waiters = []
        for t in waiters:
            t.join(60)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        abandons = [p for p, r in zip(procs, roles) if r == "abandon"]
        assert all(p.returncode == 0 for p in abandons), [p.stderr.read() for p in abandons]

        deadline = time.monotonic() + 60
        while (left := idle(d.sock)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"after {len(roles)} abandoned clients the daemon is not idle: {left}"
        # Every place on the socket is free: as many connections as it serves at once each get an answer.
        conns = [client.Connection(d.sock, autostart=False, timeout=10) for _ in range(places)]
        assert all(c.request({"op": "stats"})[0]["op"] == "stats" for c in conns)
        for c in conns:
            c.close()
        deadline = time.monotonic() + 60
        while idle(d.sock) and time.monotonic() < deadline:  # their places given back
            time.sleep(0.05)
        assert sorted(i for b in riffle.Loader(path, 1000, record_size=64, socket=d.sock, autostart=False)
                      for i in b.ids.tolist()) == list(range(N))
        # And it stops when told.
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(60) == 0
    finally:
        d.stop()
