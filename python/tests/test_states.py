"""What a client hands the daemon about a job's place and mixture, forged: refused by what it claims to describe,
with the daemon alive and serving, in a memory cgroup of 1 GiB (issue 46). No loader here starts a daemon of its own:
one that the cgroup's OOM killer ended is a failure, not a daemon started again outside the cgroup."""

from __future__ import annotations

import base64
import struct

import numpy as np
import pytest

import riffle
from conftest import Daemon, MemoryCgroup, record, write_fixed

pytestmark = pytest.mark.skipif(not MemoryCgroup.available(), reason="needs root and a v1 memory cgroup hierarchy")


def roaring_run(n: int) -> bytes:
    """A roaring bitmap (its portable format) of the ids 0..n-1, n a multiple of 65536, as runs: a few bytes a
    65,536 ids."""
    size = n >> 16
    out = struct.pack("<I", 12347 | (size - 1) << 16) + bytes([0xFF]) * ((size + 7) // 8)  # every container runs
    out += b"".join(struct.pack("<HH", k, 65535) for k in range(size))
    if size >= 4:
        out += b"".join(struct.pack("<I", 0) for _ in range(size))  # offsets, which readers skip
    return out + struct.pack("<HHH", 1, 0, 65535) * size


@pytest.fixture
def cgroup_daemon(tmp_path):
    cg = MemoryCgroup("riffle-test-states", 1 << 30)
    d = Daemon(str(tmp_path / "riffle.sock"), cgroup=cg)
    yield d, cg
    d.stop()
    cg.remove()


def test_forged_sampler_state_is_refused(cgroup_daemon, tmp_path, monkeypatch):
    """A shared loader's state claiming 2^27 records delivered (28 KB) or 2^31 (460 KB) of a dataset of 1,000: the
    daemon allocated 1 GiB and 16 GiB for it before it looked at the count, and was OOM-killed."""
    d, cg = cgroup_daemon
    monkeypatch.setenv("RIFFLE_SOCKET", d.sock)
    path = write_fixed(tmp_path / "records.bin", 1000, 64)
    ld = riffle.Loader(str(path), batch_size=10, record_size=64, seed=3, share=True, autostart=False)
    for k, _ in enumerate(ld):
        if k == 4:
            break
    state = ld.state_dict()
    ld.close()
    assert state.get("sampler_state"), state
    for n in (1 << 27, (1 << 31) - (1 << 16)):
        forged = b"RFSHR2\x00" + b"0 %d 1000 0\n" % n + roaring_run(n)
        again = riffle.Loader(str(path), batch_size=10, record_size=64, seed=3, share=True, autostart=False)
        again.load_state_dict(dict(state, sampler_state=base64.b64encode(forged).decode()))
        with pytest.raises(riffle.InvalidSpec, match="of a dataset of 1000"):
            next(iter(again))
        again.close()
        assert d.proc.poll() is None and cg.oom_kills() == cg.oom_kills_before, f"a state of {len(forged)} bytes"
    ids = np.concatenate([b.ids for b in riffle.Loader(str(path), batch_size=100, record_size=64, seed=3, autostart=False)])
    assert sorted(ids.tolist()) == list(range(1000))


def test_hostile_mixture_weights(cgroup_daemon, tmp_path, monkeypatch):
    """Weights [1, 1e308] counted for ever at a core each, past the client and SIGTERM; [1e308, 1e308] panicked."""
    d, _ = cgroup_daemon
    monkeypatch.setenv("RIFFLE_SOCKET", d.sock)
    a = write_fixed(tmp_path / "a.bin", 300, 64)
    b = tmp_path / "b.bin"
    b.write_bytes(b"".join(record(i, 64) for i in range(300, 600)))
    with pytest.raises(riffle.InvalidSpec, match=r"source 0's weight 1 is under 2\^-50"):
        next(iter(riffle.Loader(mixture=[([str(a)], 1), ([str(b)], 1e308)], batch_size=10, record_size=64, autostart=False)))
    got = [bytes(b.record(i)) for b in riffle.Loader(mixture=[([str(a)], 1e308), ([str(b)], 1e308)], batch_size=10,
                                                      record_size=64, autostart=False) for i in range(len(b))]
    assert len(got) == 600 and len(set(got)) == 600
    assert d.proc.poll() is None
