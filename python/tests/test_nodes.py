"""Four nodes on loopback: four daemons, each serving one rank, whose
memory together holds an s3:// dataset (DeepIO's distributed tier: each
block kept by its owner, asked for over TCP in the peer protocol, with the
token). Each rank sees its share of every epoch exactly once; from the
second epoch on the nodes read the object store (almost) not at all; and
when one node's daemon is killed mid-epoch the others fall back to the
object store for its blocks while its rank resumes from its checkpoint on a
restarted daemon, still exactly once."""

from __future__ import annotations

import json
import socket
import struct
import time

import pytest

import riffle
from riffle import client

from conftest import Daemon, record, status, free_port
from test_s3 import REC, s3  # noqa: F401  (the S3 server fixture)

NODES = 4
N = 4 * 900  # records: 14 MiB, 4 objects


@pytest.fixture
def cluster(s3, tmp_path, monkeypatch):  # noqa: F811
    d = s3["bucket"] / "nodes"
    d.mkdir(exist_ok=True)
    for k in range(4):
        with open(d / f"part-{k}.bin", "wb") as f:
            for i in range(k * 900, (k + 1) * 900):
                f.write(record(i, REC))
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("RIFFLE_TOKEN", "cluster-token")
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(NODES)]

    def start(i: int) -> Daemon:
        return Daemon(str(tmp_path / f"node{i}.sock"), "--tcp", addrs[i], "--peers", ",".join(addrs),
                      "--node", str(i), "--peer-bytes", "64MiB")

    nodes = [start(i) for i in range(NODES)]
    yield nodes, start
    for n in nodes:
        n.stop()


def loader(node: Daemon, rank: int) -> riffle.Loader:
    # reconnect=1: a rank whose node died resumes from its checkpoint once
    # the node is back, as the test does, instead of waiting for it.
    # prefetch=1: a daemon reads one batch ahead, so the epoch of the kill
    # still has batches to read from the dead node's blocks when it dies
    # (an adaptive read-ahead on a loaded machine may have read them all).
    return riffle.Loader("s3://bkt/nodes/*.bin", 50, record_size=REC, seed=11, rank=rank, world_size=NODES,
                         socket=node.sock, autostart=False, timeout=30, reconnect=1, prefetch=1)


def check(ids: list[int], b) -> None:
    for i, rec in zip(b.ids.tolist(), b.data):
        assert bytes(rec) == record(i, REC), f"record {i} differs from the object's"
        ids.append(i)


def test_four_nodes_share_memory_and_survive_a_kill(cluster):
    nodes, start = cluster
    lds = [loader(nodes[r], r) for r in range(NODES)]
    fetched = []
    for epoch in range(2):
        shares = []
        for ld in lds:
            ids: list[int] = []
            for b in ld:
                check(ids, b)
            assert len(ids) == len(set(ids)), f"epoch {epoch}: a record came twice to one rank"
            shares.append(set(ids))
        assert sorted(x for s in shares for x in s) == list(range(N)), f"epoch {epoch}: ranks' shares do not cover once"
        sts = [status(n.sock) for n in nodes]
        fetched.append(sum(s["peers"]["fetched"] for s in sts))
    assert sum(s["peers"]["from_peers"] for s in sts) > 0, "no node read a block from its owner"
    assert sum(s["peers"]["served"] for s in sts) > 0
    # Epoch 2 came from the nodes' memory: at most 5% of the dataset's
    # bytes from the object store.
    assert fetched[1] - fetched[0] <= 0.05 * N * REC, fetched

    # Epoch 3: node 3 dies mid-epoch.
    its = [iter(ld) for ld in lds]
    seen: list[list[int]] = [[] for _ in range(NODES)]
    saved = None
    for _ in range(5):
        for r in range(NODES):
            check(seen[r], next(its[r]))
        saved = lds[3].state_dict()
    nodes[3].proc.kill()
    nodes[3].proc.wait()
    time.sleep(0.2)
    for r in range(3):  # the others finish, reading node 3's blocks from the store
        for b in its[r]:
            check(seen[r], b)
    with pytest.raises(riffle.RiffleError):
        for b in its[3]:
            check(seen[3], b)
    # Whatever rank 3 got after its checkpoint is thrown away with the
    # dead step; it resumes from the checkpoint on a restarted daemon.
    seen[3] = seen[3][:5 * 50]
    nodes[3] = start(3)
    resumed = loader(nodes[3], 3)
    resumed.load_state_dict(saved)
    for b in resumed:
        check(seen[3], b)
    for r in range(NODES):
        assert len(seen[r]) == len(set(seen[r])), f"rank {r} saw a record twice in the epoch of the kill"
    assert sorted(x for s in seen for x in s) == list(range(N))
    fb = sum(status(n.sock)["peers"]["fallbacks"] for n in nodes[:3])
    assert fb > 0, "no node fell back to the object store for the dead node's blocks"
    for ld in lds[:3] + [resumed]:
        ld.close()


def peer_hello(addr: str, token: bytes, version: int = 1) -> tuple[int, bytes]:
    """Say a peer's hello (docs/peers.md) and return its answer's status
    and message."""
    host, port = addr.split(":")
    with socket.create_connection((host, int(port)), 5) as s:
        s.sendall(b"RFLP" + struct.pack("<BH", version, len(token)) + token)
        f = s.makefile("rb")
        tag, st, n = struct.unpack("<QBI", f.read(13))
        assert tag == 0
        return st, f.read(n)


def test_peers_refuse_without_the_token(cluster):
    nodes, _ = cluster
    st = status(nodes[0].sock)
    assert st["peers"]["nodes"] == NODES
    addr = nodes[1].proc.args[nodes[1].proc.args.index("--tcp") + 1]
    # Peers speak their own protocol on the daemon's port: a hello with a
    # wrong token, or of another version, is refused; the right one is
    # let in.
    assert peer_hello(addr, b"wrong") == (1, b"wrong token")
    st_, msg = peer_hello(addr, b"cluster-token", version=2)
    assert st_ == 1 and b"version 2" in msg
    assert peer_hello(addr, b"cluster-token") == (0, b"")
    # The client protocol knows no block op: a block request in it is
    # refused like any request before a hello.
    host, port = addr.split(":")
    with socket.create_connection((host, int(port)), 5) as s:
        b = json.dumps({"op": "block", "object": "s3://bkt/nodes/part-0.bin", "block": 0}).encode()
        s.sendall(struct.pack("<I", len(b)) + b)
        f = s.makefile("rb")
        (n,) = struct.unpack("<I", f.read(4))
        assert "hello" in json.loads(f.read(n))["message"]
