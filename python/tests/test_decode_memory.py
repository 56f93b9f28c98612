"""Decode memory (issue 46): a daemon in a 1 GiB memory cgroup (v1) reads a
directory of large JPEGs (baseline and progressive) and an 11,585 x 11,585
PNG of one colour (about 400 KB that decodes to 1.27 GB of pixels, just
under the pixel bound a record may claim), with the image transform, from
two jobs at once. Before decodes were charged to the budget, one such PNG
among 7 JPEGs got the daemon OOM-killed in a 1 GiB cgroup.

The OOM killer must end nothing; the PNG is refused by name, a DataError
naming its file, before its decode allocates; every JPEG before it arrives
with the bytes ``riffle transform`` gives it (the same binary, its decodes
unbounded, outside the cgroup). Both decoders: libjpeg-turbo (the binary
the tests use, with the turbojpeg tag) and Go's (a binary built without it).

Needs root and a v1 memory hierarchy; skipped elsewhere.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest

import riffle
from conftest import REPO, Daemon, MemoryCgroup, riffle_bin, status

pytestmark = pytest.mark.skipif(not MemoryCgroup.available(), reason="needs root and a v1 memory cgroup hierarchy")

LIMIT = 1 << 30
BOMB = 11585


def bomb_png(path: Path, side: int) -> None:
    """A side x side RGB PNG of black, its rows through zlib one at a time."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    z = zlib.compressobj(9)
    row = bytes(1 + 3 * side)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> tuple[Path, list[Path], Path]:
    """A directory of one class: five large JPEGs (two progressive) and, last, the PNG bomb."""
    from PIL import Image
    root = tmp_path_factory.mktemp("decode")
    d = root / "x"
    d.mkdir()
    rng = np.random.default_rng(5)
    jpegs = []
    for i, (w, h, progressive) in enumerate([(3000, 2000, False), (2000, 3000, False), (2400, 1800, False),
                                             (2000, 1500, True), (1600, 1200, True)]):
        base = rng.integers(0, 256, (h // 50, w // 50, 3), dtype=np.uint8)
        im = Image.fromarray(base).resize((w, h), Image.BILINEAR)
        p = d / f"a{i}.jpg"
        im.save(p, quality=90, progressive=progressive)
        jpegs.append(p)
    bomb = d / "z.png"
    bomb_png(bomb, BOMB)
    return root, jpegs, bomb


@pytest.fixture(scope="module", params=["libjpeg-turbo", "go"])
def binary(request, tmp_path_factory) -> str:
    if request.param == "libjpeg-turbo":
        return riffle_bin()
    go = shutil.which("go") or "/usr/local/go/bin/go"
    out = tmp_path_factory.mktemp("gobuild") / "riffle"
    subprocess.run([go, "build", "-o", str(out), "./cmd/riffle"], cwd=REPO, check=True)
    return str(out)


def test_decode_bomb_in_a_memory_cgroup(tmp_path, images, binary, monkeypatch):
    root, jpegs, bomb = images
    refs = []
    for p in jpegs:
        out = tmp_path / (p.name + ".rgb")
        subprocess.run([binary, "transform", "image", str(p), "--out", str(out)], check=True, capture_output=True)
        refs.append(np.fromfile(out, np.uint8).reshape(224, 224, 3))
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    sock = str(run / "riffle.sock")
    cg = MemoryCgroup("riffle-test-decode", LIMIT)
    monkeypatch.setenv("RIFFLE_BIN", binary)
    d = Daemon(sock, cgroup=cg)
    try:
        results: list = [None, None]

        def read(k: int) -> None:
            got = []
            try:
                ld = riffle.Loader(str(root), batch_size=1, transform="image", shuffle=False, autostart=False,
                                   reconnect=0, socket=sock)
                try:
                    for b in ld:
                        got.append(np.array(b.data[0]))
                    results[k] = ("no error", got)
                except riffle.DataError as e:
                    results[k] = (e, got)
                ld.close()
            except Exception as e:  # noqa: BLE001 (reported below)
                results[k] = (e, got)

        ts = [threading.Thread(target=read, args=(k,)) for k in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=600)
        assert d.proc.poll() is None, f"the daemon died (exit {d.proc.returncode})"
        assert cg.oom_kills() == cg.oom_kills_before, "the OOM killer ended a process of the daemon's cgroup"
        for err, got in results:
            assert isinstance(err, riffle.DataError), err
            assert str(bomb) in str(err) and f"{BOMB}x{BOMB}" in str(err) and "decodes at once" in str(err), str(err)
            assert len(got) == len(jpegs), f"{len(got)} outputs before the refusal, want {len(jpegs)}"
            for i, (g, ref) in enumerate(zip(got, refs)):
                assert np.array_equal(g, ref), f"{jpegs[i].name}: the output differs from riffle transform's"
        m = status(sock)["memory"]
        print(f"\n{binary}: the bomb refused by name, {len(jpegs)} JPEGs right in each of 2 jobs; "
              f"decodes' part {m['decode'] >> 20} MiB; cgroup peak {cg.peak() >> 20} MiB")
    finally:
        d.stop()
        cg.remove()
