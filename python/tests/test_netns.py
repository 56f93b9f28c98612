"""Nodes on real network stacks (issue 46): each node a network namespace
on a bridge, with its own riffle daemon (--peers: DeepIO's memory tier)
and its own torchrun; the ranks train a DDP model (gloo) across the nodes,
each reading an s3:// dataset on a real S3 server (versitygw, in a
namespace of its own) through riffle.torch. The harness is netns.py, the
ranks' script netns_train.py.

Mid-epoch (three fifths in), one node (the last) meets a fault: its
packets dropped, its daemon killed for good, its daemon restarted empty,
or its link slowed. Each time the epoch training kept is exact (every
record once across the ranks, each with the bytes of a solo read), and no
rank of the other nodes waited for a batch longer than DEADLINE, derived
from the daemons' --peer-timeout (but for a job's first batch, which also
opens it). A cluster with no fault reads each block from the store once.

What "exact" means when a node is lost (cut off, or its daemon gone):
its ranks cannot go on, so the job goes on without them as torchrun's
elastic restart makes it. The other nodes' ranks fail (DDP's collective
times out, or its peer closed), torchrun restarts them on the nodes the
rendezvous still finds, and they resume the epoch from the last
checkpoint, on the smaller world. The epoch training kept is the steps
up to that checkpoint, from the first world, then the rest from the
second; a step run after the checkpoint and before the failure is run
again, its batches thrown away with it. That epoch holds every record
once. The remaining ranks do not simply carry on: DDP cannot step without
the lost ranks, and the lost ranks' shares of the epoch would be lost.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import netns
import riffle

pytestmark = pytest.mark.skipif(netns.available() is not None, reason=str(netns.available()))

REC = 4096
N = 2400  # records: 9.4 MiB in 3 objects, 12 blocks of 1 MiB over 3 nodes
BATCH = 16
PEER_TIMEOUT = 2.0  # the daemons' --peer-timeout
# A batch whose reads ask a failed peer waits for it at most one timeout
# (each request's deadline covers its dial, its place in the pool, its
# write and its answer; the reads of a batch run at once), and once more if
# the breaker lets requests through again before the batch is whole; a
# third timeout covers the object store's reads that follow, on a machine
# shared with other tests.
DEADLINE = 3 * PEER_TIMEOUT
# How long DDP's collectives wait for a rank: for a node cut off, the time
# the others take to fail and be restarted without it. Longer than any
# wait riffle may make a rank (DEADLINE), with room. (torchrun's rendezvous
# drops the node once its heartbeats have stopped for 15s, torch 1.13's 3
# of 5s, whichever comes later.)
GLOO_TIMEOUT = DEADLINE + 2 * PEER_TIMEOUT
RECONNECT = PEER_TIMEOUT  # how long a rank whose daemon went waits for it to answer again


def dataset(c: netns.Cluster) -> dict[int, str]:
    """The dataset, in 3 objects, and what a solo read of it gives."""
    return c.solo(c.dataset("ds", N, REC), REC)


def pause(c: netns.Cluster) -> int:
    """The step after which the fault comes: three fifths into the epoch, with batches of every node's blocks to
    come, and few enough left that a restart's rest of the epoch is short."""
    return N // (len(c.nodes) * c.ranks * BATCH) * 3 // 5


def launch(c: netns.Cluster, out: Path, elastic: bool = False) -> None:
    # prefetch=1: each daemon reads one batch ahead of its ranks, so the
    # reads after the fault are still to come when it comes (a dataset this
    # small would otherwise be read whole ahead of the ranks, as one much
    # larger than a job's memory is not).
    c.launch(out, ["--url", "s3://bkt/ds/*.bin", "--record-size", str(REC), "--batch", str(BATCH),
                   "--pause-at", str(pause(c)), "--reconnect", str(RECONNECT), "--prefetch", "1"],
             min_nodes=len(c.nodes) - 1 if elastic else None, max_restarts=2 if elastic else 0,
             gloo_timeout=GLOO_TIMEOUT)


def peers(c: netns.Cluster, nodes) -> list[dict]:
    return [n.status()["peers"] for n in nodes]


def assert_no_stall(attempts: dict, nodes: set[int]) -> None:
    first, rest = netns.waits(attempts, nodes)
    # A job's first batch also opens it (listing and sizing the objects):
    # not the peers' doing, and not bounded by their deadline.
    assert rest <= DEADLINE, f"a rank of nodes {sorted(nodes)} waited {rest:.2f}s for a batch, past {DEADLINE}s"


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(ranks: int, peer_timeout: float = PEER_TIMEOUT) -> netns.Cluster:
        c = netns.Cluster(tmp_path, nodes=3, ranks=ranks, peer_timeout=peer_timeout)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_healthy(cluster, tmp_path):
    """Three nodes of two ranks: the epoch is exact, the nodes' memory served one another's blocks, and each block
    was read from the object store once, by its owner. (A peer timeout far past any wait on a loaded machine: in a
    healthy cluster nothing should fall back.)"""
    c = cluster(2, peer_timeout=30.0)
    solo = dataset(c)
    out = tmp_path / "out"
    launch(c, out)
    c.wait_at(out, pause(c), 6)
    c.go(out)
    c.wait_done(c.nodes)
    attempts, _ = netns.check_epoch(out, solo)
    assert len(attempts) == 1
    st = peers(c, c.nodes)
    assert all(s["from_peers"] > 0 and s["served"] > 0 for s in st), st
    assert sum(s["fallbacks"] for s in st) == 0, st
    # Each owner fetched its blocks from the object store once.
    assert sum(s["fetched"] for s in st) == N * REC, st


def test_cut_off(cluster, tmp_path):
    """Node 2's packets are dropped (a black hole: no error reaches anyone). The others' daemons read its blocks
    from the object store after one peer timeout; DDP's collective times out and torchrun restarts the two other
    nodes' ranks, which resume from the checkpoint: the epoch exact."""
    c = cluster(1)
    solo = dataset(c)
    out = tmp_path / "out"
    launch(c, out, elastic=True)
    c.wait_at(out, pause(c), 3)
    lost = c.nodes[2]
    c.go(out)
    c.cut(lost)
    c.wait_done(c.nodes[:2])
    attempts, _ = netns.check_epoch(out, solo)
    worlds = sorted(a["world"] for a in attempts.values())
    assert worlds[0] == 2 and worlds[-1] == 3, worlds
    assert_no_stall(attempts, {0, 1})
    st = peers(c, c.nodes[:2])
    assert all(s["fallbacks"] > 0 for s in st), st


def test_daemon_killed(cluster, tmp_path):
    """Node 2's daemon is killed and not restarted: its rank gets DaemonGone once its reconnect time is up, its node
    is drained (its torchrun stopped, as what runs the cluster would), and the two others resume from the
    checkpoint; their daemons read node 2's blocks from the object store: the epoch exact."""
    c = cluster(1)
    solo = dataset(c)
    out = tmp_path / "out"
    launch(c, out, elastic=True)
    c.wait_at(out, pause(c), 3)
    lost = c.nodes[2]
    c.go(out)
    lost.kill_daemon()
    gone = netns.wait_gone(out, lost.index)
    assert "reconnect" in gone["gone"], gone
    c.stop_torchrun(lost)
    c.wait_done(c.nodes[:2])
    attempts, _ = netns.check_epoch(out, solo)
    assert sorted(a["world"] for a in attempts.values()) == [2, 3]
    assert_no_stall(attempts, {0, 1})
    st = peers(c, c.nodes[:2])
    assert all(s["fallbacks"] > 0 for s in st), st


def test_daemon_restarted_empty(cluster, tmp_path):
    """Node 2's daemon is killed and started again with nothing in memory: its two ranks reconnect and go on from
    the batch after their last, the others read its blocks from the object store while it is down: no restart of
    the job, the epoch exact. Then the others ask it again (it fetches its blocks anew)."""
    c = cluster(2)
    solo = dataset(c)
    out = tmp_path / "out"
    launch(c, out)
    c.wait_at(out, pause(c), 6)
    node = c.nodes[2]
    c.go(out)
    node.restart_daemon()
    c.wait_done(c.nodes)
    attempts, _ = netns.check_epoch(out, solo)
    assert len(attempts) == 1
    assert_no_stall(attempts, {0, 1})
    assert node.status()["peers"]["fetched"] > 0
    # Node 0 reads the dataset again until node 2 serves it some of its
    # blocks: once node 0's breaker for it has closed (after at most the
    # breaker's longest backoff, 30s), its blocks come from it again.
    served = node.status()["peers"]["served"]
    deadline = time.monotonic() + 60
    while node.status()["peers"]["served"] == served:
        assert time.monotonic() < deadline, f"node 0 never asked the restarted node again: {peers(c, c.nodes)}"
        ld = riffle.Loader("s3://bkt/ds/*.bin", 64, record_size=REC, socket=c.nodes[0].sock, autostart=False)
        assert {i: netns.digest(bytes(b.record(k))) for b in ld for k, i in enumerate(b.ids.tolist())} == solo
        ld.close()


def test_slow_link(cluster, tmp_path):
    """Node 2's link is shaped to 8 Mbit/s each way (tbf): it still takes part, the others ask it for its blocks
    or, when it is too slow, read them from the object store; no job restart, the epoch exact."""
    c = cluster(1)
    solo = dataset(c)
    out = tmp_path / "out"
    launch(c, out)
    c.wait_at(out, pause(c), 3)
    c.go(out)
    c.slow(c.nodes[2], "1mbit", into=False)
    c.wait_done(c.nodes)
    attempts, _ = netns.check_epoch(out, solo)
    assert len(attempts) == 1
    assert_no_stall(attempts, {0, 1})
