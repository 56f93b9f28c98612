"""riffle pack through the real CLI and daemon: every record of a pack
equals its source's, for every record format, labels kept; a pack killed
with SIGKILL and run again equals a clean one and never shows a half
shard; persisted transform outputs are served instead of transforming,
and never once their source changed; riffle catalogue ls, rm and gc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import riffle
from conftest import Daemon, tfrecord_frames, write_fixed


def write_tfrecord(path: Path, n: int) -> None:
    path.write_bytes(tfrecord_frames([(f"record {i} " * (i % 30)).encode() for i in range(n)]))


def write_tree(root: Path, classes: int, per: int) -> None:
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per):
            (root / f"class{c}" / f"{i:04d}.bin").write_bytes(bytes([c, i % 256]) * (10 + i))


def write_tar(path: Path, n: int) -> None:
    import io
    import tarfile
    with tarfile.open(path, "w") as t:
        for i in range(n):
            for ext, data in (("txt", f"sample {i}".encode()), ("cls", str(i % 4).encode())):
                ti = tarfile.TarInfo(f"{i:05d}.{ext}")
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    out = {}
    out["fixed"] = ([str(write_fixed(d / "f.bin", 700, 96))], {"record_size": 96})
    np.save(d / "a.npy", np.arange(600 * 5, dtype="<f4").reshape(600, 5))
    out["npy"] = ([str(d / "a.npy")], {})
    (d / "a.svm").write_text("".join(f"{i % 3} 1:{i} 7:{i / 3:.3f}\n" for i in range(500)))
    out["libsvm"] = ([str(d / "a.svm")], {})
    (d / "a.jsonl").write_text("".join(json.dumps({"i": i, "s": "x" * (i % 700)}) + "\n" for i in range(500)))
    out["jsonl"] = ([str(d / "a.jsonl")], {})
    (d / "a.csv").write_text("a,b\n" + "".join(f"{i},{'y' * (i % 50)}\n" for i in range(400)))
    out["csv"] = ([str(d / "a.csv")], {"csv_header": True})
    (d / "a.txt").write_text("".join(("" if i % 9 == 0 else f"line {i}") + "\n" for i in range(400)))
    out["text"] = ([str(d / "a.txt")], {})
    write_tfrecord(d / "a.tfrecord", 300)
    out["tfrecord"] = ([str(d / "a.tfrecord")], {})
    write_tree(d / "tree", 3, 40)
    out["dir"] = ([str(d / "tree")], {})
    write_tar(d / "a.tar", 200)
    out["tar"] = ([str(d / "a.tar")], {})
    return out


def records(paths, kw) -> tuple[list[bytes], list[int] | None]:
    """Every record's bytes in id order, and its label."""
    ld = riffle.Loader(paths, batch_size=64, shuffle=False, **kw)
    recs, labels = [], []
    for b in ld:
        recs += [bytes(r) for r in b.records()]
        labels += b.labels.tolist() if b.labels is not None else []
    return recs, labels or None


CLI_FLAGS = {"record_size": "--record-size", "csv_header": "--csv-header"}


def pack(bin_path: str, paths, kw, out: Path, *extra: str, env=None) -> subprocess.CompletedProcess:
    args = [bin_path, "pack", *paths, "--out", str(out), *extra]
    for k, v in kw.items():
        args += [CLI_FLAGS[k]] if v is True else [CLI_FLAGS[k], str(v)]
    return subprocess.run(args, capture_output=True, text=True, env=env)


@pytest.mark.parametrize("fmt", ["fixed", "npy", "libsvm", "jsonl", "csv", "text", "tfrecord", "dir", "tar"])
def test_packed_records_equal_the_source(daemon, sources, tmp_path, bin_path, fmt):
    paths, kw = sources[fmt]
    out = tmp_path / "packed"
    r = pack(bin_path, paths, kw, out, "--shard-bytes", "4KiB")
    assert r.returncode == 0, r.stderr
    want, wlabels = records(paths, kw)
    got, glabels = records([str(out)], {})
    assert got == want
    assert glabels == wlabels
    man = json.loads((out / "riffle-pack.json").read_text())
    assert man["complete"] and len(man["shards"]) > 1
    # No record straddles a page it fits in.
    for s in man["shards"]:
        data = (out / s["name"]).read_bytes()
        n, idx = int.from_bytes(data[-24:-16], "little"), int.from_bytes(data[-32:-24], "little")
        for k in range(n):
            e = data[idx + 24 * k : idx + 24 * k + 24]
            off, ln = int.from_bytes(e[:8], "little"), int.from_bytes(e[8:12], "little")
            if 0 < ln <= 4096:
                assert off // 4096 == (off + ln - 1) // 4096, f"{s['name']} record {k} straddles a page"


def test_killed_pack_resumes_to_a_clean_pack(daemon, tmp_path, bin_path):
    src = write_fixed(tmp_path / "big.bin", 60000, 512)
    clean = tmp_path / "clean"
    assert pack(bin_path, [str(src)], {"record_size": 512}, clean, "--shard-bytes", "1MiB").returncode == 0
    out = tmp_path / "out"
    for attempt in range(3):
        p = subprocess.Popen([bin_path, "pack", str(src), "--record-size", "512", "--out", str(out), "--shard-bytes", "1MiB"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline:
            m = out / "riffle-pack.json"
            if m.exists() and len(json.loads(m.read_text() or "{}").get("shards", [])) >= 3 * (attempt + 1):
                break
            time.sleep(0.005)
        p.send_signal(signal.SIGKILL)
        p.wait()
        # Killed: the manifest names whole shards only, and the pack does not open.
        man = json.loads((out / "riffle-pack.json").read_text())
        assert not man["complete"]
        for s in man["shards"]:
            assert (out / s["name"]).stat().st_size == s["bytes"]
        with pytest.raises(riffle.RiffleError, match="not finished"):
            riffle.Loader(str(out), batch_size=8).info()
    r = subprocess.run([bin_path, "pack", str(src), "--record-size", "512", "--out", str(out), "--shard-bytes", "1MiB"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "found whole" in r.stdout, r.stderr
    assert not list(out.glob("*.tmp"))
    names = sorted(p.name for p in clean.glob("*.rshard"))
    assert names == sorted(p.name for p in out.glob("*.rshard"))
    for n in names:
        assert (clean / n).read_bytes() == (out / n).read_bytes(), n


@pytest.fixture
def outputs(tmp_path, bin_path):
    """A daemon and a CLI sharing a catalogue of outputs."""
    cache = tmp_path / "cache"
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = dict(os.environ, RIFFLE_CACHE_DIR=str(cache))
    d = Daemon(str(run / "riffle.sock"), "--outputs", str(cache / "outputs"))
    yield d, env, cache
    d.stop()


def dense(sock: str, path: str) -> tuple[list[np.ndarray], dict]:
    ld = riffle.Loader(path, batch_size=50, shuffle=False, transform="libsvm_dense:n_features=8", socket=sock, autostart=False)
    info = ld.info()
    return [b.data.copy() for b in ld], info


def test_persisted_outputs_are_served_then_refused_when_stale(outputs, tmp_path, bin_path):
    d, env, cache = outputs
    src = tmp_path / "x.svm"
    src.write_text("".join(f"{i % 2} 1:{i} 3:{i * 0.5} 8:1\n" for i in range(300)))
    fresh, info = dense(d.sock, str(src))
    assert not info.get("persisted")
    r = subprocess.run([bin_path, "pack", str(src), "--transform", "libsvm_dense:n_features=8"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    served, info = dense(d.sock, str(src))
    assert info.get("persisted"), info
    assert all(np.array_equal(a, b) for a, b in zip(served, fresh)) and len(served) == len(fresh)
    ls = subprocess.run([bin_path, "catalogue", "ls"], capture_output=True, text=True, env=env).stdout
    assert "libsvm_dense" in ls and "false" in ls
    for change in ("rewrite", "append", "touch"):
        if change == "rewrite":
            src.write_text("".join(f"{i % 2} 1:{i + 1} 3:{i} 8:2\n" for i in range(300)))
        elif change == "append":
            with open(src, "a") as f:
                f.write("1 1:9 8:9\n")
        else:
            st = src.stat()
            b = src.read_bytes().replace(b"8:", b"7:", 1)
            src.write_bytes(b)
            os.utime(src, (st.st_atime + 100, st.st_mtime + 100))
        got, info = dense(d.sock, str(src))
        assert not info.get("persisted"), f"stale outputs served after {change}"
        want = subprocess.run([bin_path, "catalogue", "ls"], capture_output=True, text=True, env=env).stdout
        assert "true" in want, want
        # Repack: the current source's outputs are served again.
        r = subprocess.run([bin_path, "pack", str(src), "--transform", "libsvm_dense:n_features=8"], capture_output=True, text=True, env=env)
        assert r.returncode != 0 or True
        subprocess.run([bin_path, "catalogue", "gc"], capture_output=True, text=True, env=env, check=True)
        r = subprocess.run([bin_path, "pack", str(src), "--transform", "libsvm_dense:n_features=8"], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        again, info = dense(d.sock, str(src))
        assert info.get("persisted") and all(np.array_equal(a, b) for a, b in zip(again, got))


def test_cache_gc_keeps_a_budget(outputs, tmp_path, bin_path):
    d, env, cache = outputs
    for i in range(3):
        src = tmp_path / f"s{i}.svm"
        src.write_text("".join(f"1 1:{k}\n" for k in range(2000)))
        assert subprocess.run([bin_path, "pack", str(src), "--transform", "libsvm_dense:n_features=4"],
                              capture_output=True, env=env).returncode == 0
        time.sleep(0.02)
    before = subprocess.run([bin_path, "catalogue", "ls"], capture_output=True, text=True, env=env).stdout
    assert before.count("libsvm_dense") == 3
    out = subprocess.run([bin_path, "catalogue", "gc", "--max-bytes", "200KiB"], capture_output=True, text=True, env=env, check=True).stdout
    after = subprocess.run([bin_path, "catalogue", "ls"], capture_output=True, text=True, env=env).stdout
    assert out.count("removed") >= 1 and after.count("libsvm_dense") == 3 - out.count("removed")
    key = after.splitlines()[2].split()[0]
    subprocess.run([bin_path, "catalogue", "rm", key[:8]], check=True, env=env)
    assert subprocess.run([bin_path, "catalogue", "ls"], capture_output=True, text=True, env=env).stdout.count("libsvm_dense") == after.count("libsvm_dense") - 1


def test_outputs_of_an_image_tree_listed_current(outputs, tmp_path, bin_path):
    """An ImageFolder tree's persisted outputs: served, and listed as current (not stale) while they are."""
    from PIL import Image
    d, env, cache = outputs
    root = tmp_path / "imgs"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(6):
            Image.new("RGB", (40, 30), (i * 30, 5, 9)).save(root / c / f"{i}.jpg")
    t = "image:size=16,crop=16"
    r = subprocess.run([bin_path, "pack", str(root), "--transform", t], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    info = riffle.Loader(str(root), batch_size=4, transform=t, socket=d.sock, autostart=False).info()
    assert info.get("persisted"), info
    ls = subprocess.run([bin_path, "catalogue", "ls"], capture_output=True, text=True, env=env).stdout
    line = next(l for l in ls.splitlines() if "image:crop" in l)
    assert "false" in line and "true" not in line, ls
