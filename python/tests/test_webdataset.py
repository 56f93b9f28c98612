"""WebDataset tar shards written by webdataset.TarWriter and by Python's
tarfile (long names, pax headers, directories, hidden files), read back
through a real daemon in a shuffled order: every sample equals what
webdataset's own reader yields for its key; bad shards are errors naming
the file and offset."""

from __future__ import annotations

import gzip
import io
import random
import tarfile

import pytest
import webdataset as wds

import riffle
import riffle.torch as rt


def samples(n: int, seed: int, prefix: str = "") -> list[dict]:
    r = random.Random(seed)
    out = []
    for i in range(n):
        s = {"__key__": f"{prefix}{i:06d}", "cls": str(r.randint(0, 9)).encode(),
             "jpg": bytes(r.randrange(256) for _ in range(r.randint(0, 3000)))}
        if i % 3 == 0:
            s["json"] = b'{"i": %d}' % i
        out.append(s)
    return out


def webdataset_samples(paths) -> dict[str, dict]:
    """What webdataset's own reader yields, by key."""
    got = {}
    for s in wds.WebDataset([str(p) for p in paths], shardshuffle=False, empty_check=False):
        s = {k: v for k, v in s.items() if k != "__url__" and not k.startswith("__local")}
        got[s["__key__"]] = s
    return got


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("wds")
    paths = []
    for k in range(2):
        p = d / f"shard-{k:04d}.tar"
        with wds.TarWriter(str(p)) as w:
            for s in samples(150, k, prefix=f"s{k}/"):
                w.write(s)
        paths.append(p)
    # One by tarfile, with the cases webdataset's writer never makes.
    p = d / "shard-tarfile.tar"
    long_key = "deep/" + "d" * 120 + "/sample"
    with tarfile.open(p, "w", format=tarfile.GNU_FORMAT) as tf:
        def add(name, data, kind=tarfile.REGTYPE):
            ti = tarfile.TarInfo(name)
            ti.type, ti.size = kind, len(data)
            tf.addfile(ti, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        add("dir/", b"", tarfile.DIRTYPE)
        add("dir/a.txt", b"alpha")
        add("dir/a.cls", b"1")
        add("dir/.hidden", b"skip me")
        add(long_key + ".txt", b"long name")
        add(long_key + ".seg.png", b"two dots")
        add("dir/b.TXT", b"upper")
    paths.append(p)
    pax = d / "shard-pax.tar"
    with tarfile.open(pax, "w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(5):
            data = f"üñí {i}".encode()
            ti = tarfile.TarInfo(f"päx/{'p' * 110}{i}.txt")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    paths.append(pax)
    return paths


def test_every_sample_equals_webdataset(daemon, shards):
    want = webdataset_samples(shards)
    ld = riffle.Loader([str(p) for p in shards], batch_size=32, seed=4)
    got = {}
    order = []
    for b in ld:
        for s in b.data:
            got[s["__key__"]] = s
            order.append(s["__key__"])
    assert len(order) == len(got) == len(want), (len(order), len(got), len(want))
    assert got == want
    assert order != sorted(order)


def test_torch_gives_sample_dicts(daemon, shards):
    dl = rt.loader(str(shards[0]), 16, num_workers=2)
    n = 0
    for batch in dl:
        assert isinstance(batch, list) and "cls" in batch[0] and "__key__" in batch[0]
        n += len(batch)
    assert n == 150


def corrupt(src, dst, at: int, value: bytes) -> None:
    b = bytearray(src.read_bytes())
    b[at : at + len(value)] = value
    dst.write_bytes(bytes(b))


def test_bad_header_checksum_names_file_and_offset(daemon, shards, tmp_path):
    bad = tmp_path / "bad.tar"
    data = shards[0].read_bytes()
    second = 512 + (int(data[124:136].strip(b" \x00") or b"0", 8) + 511) // 512 * 512
    corrupt(shards[0], bad, second + 10, b"XX")  # inside the second member's name
    with pytest.raises(riffle.RiffleError) as e:
        riffle.Loader(str(bad), batch_size=4).info()
    assert "bad.tar" in str(e.value) and f"offset {second}" in str(e.value) and "checksum" in str(e.value)


def test_member_cut_short(daemon, shards, tmp_path):
    cut = tmp_path / "cut.tar"
    data = shards[0].read_bytes()
    cut.write_bytes(data[: len(data) // 2 + 100])
    with pytest.raises(riffle.RiffleError, match="cut short") as e:
        riffle.Loader(str(cut), batch_size=4).info()
    assert "cut.tar" in str(e.value)
    n = riffle.Loader(str(cut), batch_size=4, drop_partial=True).info()["records"]
    assert 0 < n < 150


def test_compressed_shard_says_why(daemon, shards, tmp_path):
    gz = tmp_path / "shard.tar.gz"
    gz.write_bytes(gzip.compress(shards[0].read_bytes()))
    with pytest.raises(riffle.RiffleError, match="random access") as e:
        riffle.Loader(str(gz), batch_size=4).info()
    assert "gunzip" in str(e.value) or "decompress" in str(e.value)
