"""A dataset larger than memory is read past the page cache when ``direct=`` is left unset: a daemon in a 256 MiB
memory cgroup (v1) shuffles 469 MiB of 4 KiB records, of which a cache of half its memory would keep 27%: under the
30% from which a page steward keeping the pages read soonest pays (job/direct.go), and an LRU would answer 1 in 24
page reads. It chooses O_DIRECT from the cgroup's limit alone (no option), every record comes back once with its bytes,
and the cgroup's page cache stays as it was; ``direct=False`` reads the same epoch through the cache, which the
cgroup is then charged for. Needs root and a v1 memory hierarchy (as test_budget.py)."""

from __future__ import annotations

import contextlib
import os

import pytest

import riffle
from conftest import Daemon, MemoryCgroup, record, status, write_fixed

pytestmark = pytest.mark.skipif(not MemoryCgroup.available(), reason="needs root and a v1 memory cgroup hierarchy")

LIMIT = 256 << 20
N, SIZE = 120_000, 4096  # 469 MiB


def page_cache(cg: MemoryCgroup) -> int:
    """The files' pages the cgroup is charged for: memory.stat's cache, less its shmem (the daemon's shared-memory
    arenas, which count as cache)."""
    stat = dict(line.split(" ") for line in cg._read("memory.stat").splitlines())
    return int(stat["cache"]) - int(stat["shmem"])


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def epoch(ld, each=None) -> set[int]:
    """One epoch's ids; each record's bytes are its writer's, and no id comes twice. each(seen) is called after
    every batch."""
    seen: set[int] = set()
    for b in ld:
        for k, i in enumerate(b.ids):
            i = int(i)
            assert i not in seen, f"record {i} twice in an epoch"
            seen.add(i)
            if i % 97 == 0:  # a sample of the bytes: record() builds each one in numpy
                assert bytes(b.record(k)) == record(i, SIZE), f"record {i}'s bytes differ from its writer's"
        if each:
            each(seen)
    return seen


@contextlib.contextmanager
def daemon_in_cgroup(tmp_path, name: str):
    """A daemon in a memory cgroup of LIMIT, its socket yielded; the page cache dropped."""
    cg = MemoryCgroup(name, LIMIT)
    sock = str(tmp_path / "run" / "riffle.sock")
    os.makedirs(os.path.dirname(sock), mode=0o700)
    d = Daemon(sock, cgroup=cg)
    try:
        drop_caches()
        yield sock, cg
    finally:
        d.stop()
        cg.remove()


def test_larger_than_memory_reads_past_the_page_cache(tmp_path):
    big = write_fixed(tmp_path / "big.bin", N, SIZE)
    with daemon_in_cgroup(tmp_path, "riffle-test-direct") as (sock, cg):
        before = page_cache(cg)
        ld = riffle.Loader(str(big), 1024, record_size=SIZE, seed=1, socket=sock)
        assert ld.direct is True, "a shuffle of twice the memory, direct= unset, is read through the page cache"
        assert epoch(ld) == set(range(N))
        grown = page_cache(cg) - before
        assert grown < 16 << 20, f"reading past the page cache, the cgroup's page cache grew by {grown >> 20} MiB"

        drop_caches()
        before = page_cache(cg)
        ld = riffle.Loader(str(big), 1024, record_size=SIZE, seed=1, socket=sock, direct=False)
        assert ld.direct is False
        assert epoch(ld) == set(range(N))
        grown = page_cache(cg) - before
        assert grown > 64 << 20, f"through the page cache, the cgroup's page cache grew by only {grown >> 20} MiB"


def test_a_shuffle_the_steward_keeps_reads_through_the_page_cache(tmp_path):
    """312 MiB of 4 KiB records in the same cgroup: half its memory would keep 41% of them, which a steward keeping the
    pages read soonest answers (an LRU would answer 1 in 11: before the steward, this went past the cache). The job
    reads through the page cache, every record once with its bytes, and its steward drops pages as the cgroup fills,
    which status reports on the job's line (pages_kept, pages_dropped)."""
    n = 80_000
    big = write_fixed(tmp_path / "big.bin", n, SIZE)
    with daemon_in_cgroup(tmp_path, "riffle-test-steward") as (sock, _):
        ld = riffle.Loader(str(big), 1024, record_size=SIZE, seed=2, socket=sock)
        assert ld.direct is False, "a shuffle the steward keeps 41% of goes past the page cache"
        pages = []

        def look(seen: set[int]) -> None:
            if not pages and len(seen) >= n * 19 // 20:
                groups = [g for g in status(sock)["groups"] if g["jobs"]]
                assert len(groups) == 1, groups
                pages.extend([groups[0].get("pages_kept", 0), groups[0].get("pages_dropped", 0)])

        seen = epoch(ld, look)
        assert seen == set(range(n))
        kept, dropped = pages
        assert kept > 0 and dropped > 0, f"the steward kept {kept} pages and dropped {dropped} with the cgroup full"
        assert kept * 4096 < LIMIT, f"the steward counts {kept} pages kept in a {LIMIT >> 20} MiB cgroup"
