"""Chaos: many real clients against one daemon, some killed at random,
some sending absurd specs, one reading slowly; the daemon itself killed
with SIGKILL and restarted. Every surviving job still sees each record
exactly once per epoch, and the daemon's jobs, shared-memory arenas and
memory return to where they started. Where the machine allows (root, a v1
memory hierarchy) the daemon runs in a 512 MiB memory cgroup of its own,
started inside it, and the OOM killer ends nothing. Bounded: a dozen
clients, seconds."""

from __future__ import annotations

import os
import random
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time

from conftest import REPO, Daemon, MemoryCgroup, free_port, write_fixed
from test_s3 import REC, s3  # noqa: F401  (the S3 server fixture)

N = 4000

SURVIVOR = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {py!r})
    import riffle
    def loader():
        # reconnect=0: this client resumes from its own checkpoint, as a
        # training script does after a crash (test_together covers the
        # loader's own reconnection).
        return riffle.Loader({path!r}, batch_size=50, record_size={rec}, seed={seed}, timeout=5, autostart=False,
                             sampler={sampler!r}, reconnect=0)
    ld = loader()
    for epoch in range(2):
        ids = []
        while True:
            try:
                for b in ld:
                    ids += b.ids.tolist()
                    time.sleep({sleep})
                break
            except riffle.RiffleError as e:  # the daemon died: resume where we were once it is back
                state = ld.state_dict()
                deadline = time.time() + 30
                while True:
                    try:
                        ld = loader()
                        ld.load_state_dict(state)
                        ld.info()
                        break
                    except riffle.RiffleError:
                        if time.time() > deadline:
                            raise
                        time.sleep(0.1)
                print("resumed", state, flush=True)
        assert sorted(ids) == list(range({n})), f"epoch {{epoch}}: {{len(ids)}} ids, {{len(set(ids))}} distinct"
        print("epoch ok", epoch, flush=True)
    print("ok", flush=True)
""")

VICTIM = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {py!r})
    import riffle
    ld = riffle.Loader({path!r}, batch_size=50, record_size={rec}, seed={seed}, autostart=False, pipeline=4)
    held = []
    for b in ld:
        held.append(b)  # holds its batches: its shared memory is in use when it dies
        print("batch", flush=True)
        time.sleep(0.02)
""")

ABSURD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {py!r})
    import riffle
    from riffle import client
    c = client.Connection(autostart=False)
    for spec in [{{"batch_size": 2**62}}, {{"depth": 10**9}}, {{"memory_bytes": 1}}, {{"memory_bytes": 2**62}},
                 {{"world": -3}}, {{"prefetch": 10**7}}, {{"sampler": "buffered", "buffer": 2**40}}]:
        spec = dict({{"paths": [{path!r}], "record_size": 256, "batch_size": 50, "shuffle": True}}, **spec)
        try:
            c.request({{"op": "open", "spec": spec}})
            raise SystemExit("an absurd spec was accepted: %r" % spec)
        except riffle.RiffleError as e:
            assert "invalid job spec" in str(e), e
    ids = [i for b in riffle.Loader({path!r}, batch_size=50, record_size=256, autostart=False) for i in b.ids.tolist()]
    assert sorted(ids) == list(range({n}))
    print("ok", flush=True)
""")


def spawn(code: str, sock: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, RIFFLE_SOCKET=sock))


def footprint(pid: int) -> tuple[int, int]:
    """Shared-memory arenas the daemon has open, and its resident memory in KiB."""
    fds = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if "riffle-job" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                fds += 1
        except OSError:
            pass
    rss = 0
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return fds, rss


def settle(d: Daemon, within: float = 10.0) -> tuple[int, int, int]:
    deadline = time.monotonic() + within
    while True:
        jobs = d.stats().get("jobs", 0)
        fds, rss = footprint(d.proc.pid)
        if (jobs == 0 and fds == 0) or time.monotonic() > deadline:
            return jobs, fds, rss
        time.sleep(0.05)


def test_chaos(tmp_path):
    rng = random.Random(42)
    path = str(write_fixed(tmp_path / "chaos.bin", N, 256))
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    sock = str(run / "riffle.sock")
    py = str(REPO / "python")
    cg = MemoryCgroup("riffle-test-chaos", 512 << 20) if MemoryCgroup.available() else None
    d = Daemon(sock, "--cache-bytes", "16MiB", cgroup=cg)
    _, _, base_rss = settle(d)
    try:
        survivors = [spawn(SURVIVOR.format(py=py, path=path, rec=256, seed=s, n=N, sleep=0.015, sampler=smp), sock)
                     for s, smp in [(1, "global"), (2, "buffered"), (3, "block")]]
        slow = spawn(SURVIVOR.format(py=py, path=path, rec=256, seed=9, n=N, sleep=0.05, sampler="global"), sock)
        absurd = [spawn(ABSURD.format(py=py, path=path, n=N), sock) for _ in range(2)]
        victims = [spawn(VICTIM.format(py=py, path=path, rec=256, seed=10 + i), sock) for i in range(4)]
        for v in victims:
            for _ in range(rng.randint(1, 6)):
                v.stdout.readline()
            v.send_signal(signal.SIGKILL)
            v.wait()
        for a in absurd:
            out, err = a.communicate(timeout=120)
            assert a.returncode == 0 and "ok" in out, err
        # Kill the daemon in the middle of the survivors' second epochs
        # (each has said its first was whole), start another.
        for p in survivors:  # the slow reader is still in its first
            assert p.stdout.readline().startswith("epoch ok 0"), p.stderr.read()[-2000:]
        time.sleep(rng.uniform(0.05, 0.2))
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        d.log.close()
        d = Daemon(sock, "--cache-bytes", "16MiB", cgroup=cg)
        _, _, base_rss = settle(d)
        resumed = 0
        for p in survivors + [slow]:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0 and out.strip().endswith("ok"), err[-2000:]
            resumed += "resumed" in out
        assert resumed == len(survivors) + 1, f"only {resumed} clients were cut off by the daemon's death"
        jobs, fds, rss = settle(d)
        assert jobs == 0, f"{jobs} jobs left"
        assert fds == 0, f"{fds} shared-memory arenas left open"
        # Resident memory back near where it was: the 16 MiB cache, Go's
        # heap it has not returned yet, and no more.
        assert rss < base_rss + 96 * 1024, f"RSS {rss} KiB after, {base_rss} KiB at start"
        if cg is not None:
            assert cg.oom_kills() == cg.oom_kills_before, "the OOM killer ended a process of the daemon's cgroup"
    finally:
        d.stop()
        if cg is not None:
            cg.remove()


def absurd_peer_frames(addr: str, token: bytes, rng: random.Random) -> None:
    """Peer frames a hostile or broken node might send (docs/peers.md): block
    and offset near 2^63 and 2^62, negative lengths, names past their bounds,
    and random bytes after the magic. Each ends in an answer or a closed
    connection, never the daemon."""
    host, port = addr.split(":")
    frames = []
    for block, off, n in [(0, 2**63 - 10, 100), (2**62, 0, 0), (-1, 0, 0), (0, -5, 10), (0, 0, -1), (2**63 - 1, 2**63 - 1, 2**63 - 1)]:
        obj, ver = b"bkt/fixed/part-0.bin", b"x"
        frames.append(struct.pack("<QqqqHH", 7, block, off, n, len(obj), len(ver)) + obj + ver)
    frames.append(struct.pack("<QqqqHH", 8, 0, 0, 0, 65535, 65535))
    frames.append(bytes(rng.getrandbits(8) for _ in range(200)))
    for f in frames:
        try:
            with socket.create_connection((host, int(port)), 5) as c:
                c.settimeout(5)
                c.sendall(b"RFLP" + struct.pack("<BH", 1, len(token)) + token + f)
                c.shutdown(socket.SHUT_WR)  # the frame is all: the daemon answers, then reads the end
                while c.recv(1 << 16):
                    pass
        except OSError:
            pass


def test_chaos_with_peers(s3, tmp_path, monkeypatch):  # noqa: F811
    """Two nodes whose memory holds an s3:// dataset together (--peers),
    each daemon in a memory cgroup of its own where the machine allows:
    clients on both read every record exactly once per epoch while others
    holding batches are killed, absurd peer frames arrive, and one node's
    daemon is killed and restarted; its clients resume, the other node's
    go on from the object store. No OOM kill, no daemon lost but the one
    killed."""
    rng = random.Random(7)
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("RIFFLE_TOKEN", "chaos-token")
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    cgs = [MemoryCgroup(f"riffle-test-chaos-node{i}", 512 << 20) if MemoryCgroup.available() else None for i in range(2)]
    socks = []
    for i in range(2):
        run = tmp_path / f"run{i}"
        run.mkdir(mode=0o700)
        socks.append(str(run / "riffle.sock"))

    def start(i: int) -> Daemon:
        return Daemon(socks[i], "--tcp", addrs[i], "--peers", ",".join(addrs), "--node", str(i),
                      "--peer-bytes", "32MiB", "--cache-bytes", "16MiB", cgroup=cgs[i])

    nodes = [start(i) for i in range(2)]
    py, path, n = str(REPO / "python"), "s3://bkt/fixed/*.bin", 2100
    try:
        # 42 batches an epoch, 2 s.
        survivors = [spawn(SURVIVOR.format(py=py, path=path, rec=REC, seed=s, n=n, sleep=0.05, sampler="global"), socks[s % 2])
                     for s in range(4)]
        victims = [spawn(VICTIM.format(py=py, path=path, rec=REC, seed=10 + i), socks[i % 2]) for i in range(2)]
        for v in victims:
            for _ in range(rng.randint(1, 4)):
                v.stdout.readline()
            v.send_signal(signal.SIGKILL)
            v.wait()
        for addr in addrs:
            absurd_peer_frames(addr, b"chaos-token", rng)
        assert all(nd.proc.poll() is None for nd in nodes), "a node died of peer frames"
        # Node 1's daemon dies once its clients have said their first epoch
        # was whole; a new one starts in its place.
        for p in survivors[1::2]:
            assert p.stdout.readline().startswith("epoch ok 0"), p.stderr.read()[-2000:]
        nodes[1].proc.send_signal(signal.SIGKILL)
        nodes[1].proc.wait()
        nodes[1].log.close()
        nodes[1] = start(1)
        for i, p in enumerate(survivors):
            # Not communicate(): the lines readline buffered would be lost.
            out, err = p.stdout.read(), p.stderr.read()
            assert p.wait(timeout=300) == 0 and out.strip().endswith("ok"), err[-2000:]
            if i % 2:
                assert "resumed" in out, f"a client of node 1 was not cut off by its daemon's death: {out}"
        assert nodes[0].proc.poll() is None, "node 0 died"
        for cg in cgs:
            if cg is not None:
                assert cg.oom_kills() == cg.oom_kills_before, "the OOM killer ended a process of a node's cgroup"
    finally:
        for nd in nodes:
            nd.stop()
        for cg in cgs:
            if cg is not None:
                cg.remove()
