"""Run by scripts/test-installed.sh against the pip-installed package: riffle
imports from site-packages, starts the daemon bundled in the wheel, and
`riffle` is on PATH. The daemon needs nothing beyond the C library, is
stripped, and decodes JPEGs with the libjpeg-turbo linked into it."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

# What every dynamically linked Linux program loads: the C library's own
# objects. The wheel's daemon may need these and nothing else.
C_LIBRARY = re.compile(r"(linux-vdso|libc|libm|libpthread|libdl|librt|ld-linux(-[\w-]+)?)\.so(\.\d+)*")


@pytest.fixture(scope="module", autouse=True)
def socket():
    """A socket of this run's own, in a private directory, for the daemon the client starts."""
    run = Path(tempfile.mkdtemp(prefix="riffle-run-"))
    run.chmod(0o700)
    os.environ["RIFFLE_SOCKET"] = str(run / "riffle.sock")
    yield
    del os.environ["RIFFLE_SOCKET"]


def installed_daemon() -> str:
    from riffle import client
    binary = client.find_binary()
    assert "site-packages" in binary and Path(binary).name == "riffle", binary
    return binary


def test_installed_package_loads_and_shuffles():
    import riffle

    assert "site-packages" in riffle.__file__, riffle.__file__
    installed_daemon()
    on_path = shutil.which("riffle")
    assert on_path and "version" in subprocess.run([on_path, "--version"], capture_output=True, text=True).stdout
    d = Path(tempfile.mkdtemp())
    path = d / "r.bin"
    np.arange(1000, dtype="<i8").repeat(8).tofile(path)  # record i: eight copies of i
    ld = riffle.Loader(str(path), batch_size=100, record_size=64, dtype=np.int64, shape=(8,), seed=3)
    ids = []
    for b in ld:
        x = b.data
        assert (x[:, 0] == b.ids).all()
        ids += b.ids.tolist()
    assert sorted(ids) == list(range(1000)) and ids != sorted(ids)
    import riffle.torch as rt
    n = sum(len(t) for t in rt.loader(str(path), 128, record_size=64, dtype=np.int64, shape=(8,), num_workers=2))
    assert n == 1000


def test_installed_daemon_needs_only_the_c_library():
    """The wheel carries everything the daemon loads beyond the C library: libjpeg-turbo is linked into it, not a
    libjpeg.so.62 that a user's machine may lack."""
    binary = installed_daemon()
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    needs = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert needs, out
    beyond = [n for n in needs if not C_LIBRARY.fullmatch(os.path.basename(n))]
    assert not beyond, f"{binary} needs {beyond} beyond the C library:\n{out}"


def elf_sections(path: str) -> list[str]:
    """The section names of a 64-bit little-endian ELF file (the ELF header, then its section header table)."""
    with open(path, "rb") as f:
        head = f.read(64)
        assert head[:4] == b"\x7fELF" and head[4:6] == b"\x02\x01", f"{path}: not a 64-bit little-endian ELF file"
        (shoff,) = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        # Elf64_Shdr: name, type, flags, addr, offset, size, ...
        headers = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
        f.seek(headers[shstrndx][4])
        names = f.read(headers[shstrndx][5])
    return [names[h[0]:names.index(b"\0", h[0])].decode() for h in headers]


def test_installed_daemon_is_stripped():
    """No symbol table and no DWARF (go build -ldflags "-s -w"): the wheel's daemon is a quarter smaller. Go's
    own tables still name each function and line in a panic's trace."""
    sections = elf_sections(installed_daemon())
    assert ".text" in sections, sections
    kept = [s for s in sections if s == ".symtab" or s.startswith((".debug_", ".zdebug_"))]
    assert not kept, f"the daemon keeps {kept}"


def test_installed_daemon_decodes_jpegs_as_torchvision(tmp_path):
    """The wheel's daemon decodes JPEGs with the libjpeg-turbo linked into it: a JPEG decoded at full scale,
    resized and cropped, is torchvision's Resize(256) + CenterCrop(224) of a PIL image byte for byte, which Go's
    image/jpeg (what a build without libjpeg.a falls back to) is not."""
    from PIL import Image
    import torchvision.transforms as T

    import riffle
    rng = np.random.default_rng(5)
    h, w = 375, 500  # shorter side under twice 256: decoded at full scale
    yy, xx = np.mgrid[0:h, 0:w]
    base = 128 + 60 * np.sin(xx * 0.03) * np.cos(yy * 0.02)
    img = np.stack([base, base * 0.7, 255 - base], -1) + rng.integers(-20, 20, (h, w, 3))
    (tmp_path / "c0").mkdir()
    path = tmp_path / "c0" / "0.jpg"
    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(path, quality=90)
    b = next(iter(riffle.Loader(str(tmp_path), batch_size=1, transform="image")))
    ref = np.asarray(T.Compose([T.Resize(256), T.CenterCrop(224)])(Image.open(path).convert("RGB")))
    d = np.abs(b.data[0].astype(np.int32) - ref.astype(np.int32))
    assert d.max() == 0, f"{int((d > 0).sum())} values differ from torchvision's, by up to {d.max()}"
