"""What the benchmarks in bench/ share: making data, dropping the page
cache, reading the device's counters, running the daemon in a memory
cgroup (v1) and measuring a process's CPU time."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))


def parse_size(s: str) -> int:
    m = re.fullmatch(r"([\d.]+)\s*([KMGT]i?B?)?", s)
    if not m:
        raise SystemExit(f"size {s!r}")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[(m.group(2) or "")[:1]]
    return int(float(m.group(1)) * mult)


def make_file(path: Path, size: int, rs: int) -> None:
    """Fixed-size records, each starting with its id (little-endian uint64)."""
    if path.exists() and path.stat().st_size == size // rs * rs:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    n = size // rs
    per = (64 << 20) // rs
    with open(path, "wb") as f:
        for lo in range(0, n, per):
            k = min(per, n - lo)
            block = np.zeros((k, rs), np.uint8)
            block[:, :8] = np.arange(lo, lo + k, dtype="<u8").view(np.uint8).reshape(k, 8)
            f.write(block.tobytes())


def make_jpegs(root: Path, n: int, classes: int = 10) -> None:
    """ImageNet-like JPEGs (about 500x375, quality 90) with detail at every scale, made with Pillow."""
    if root.exists() and sum(1 for _ in root.rglob("*.jpg")) == n:
        return
    from PIL import Image
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:375, 0:500]
    for i in range(n):
        d = root / f"c{i % classes:02d}"
        d.mkdir(parents=True, exist_ok=True)
        fx, fy, ph = rng.uniform(0.005, 0.08, 3)
        base = 128 + 60 * np.sin(xx * fx + ph) * np.cos(yy * fy)
        img = np.stack([base, base * rng.uniform(0.6, 1), 255 - base], -1) + rng.integers(-25, 25, (375, 500, 3))
        w, h = int(rng.integers(400, 500)), int(rng.integers(300, 375))
        Image.fromarray(img.clip(0, 255).astype(np.uint8)[:h, :w]).save(d / f"{i:06d}.jpg", quality=90)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def device_of(path: Path) -> str:
    dev = os.stat(path).st_dev
    want = f"{os.major(dev)}:{os.minor(dev)}"
    for d in glob.glob("/sys/block/*/dev") + glob.glob("/sys/block/*/*/dev"):
        if open(d).read().strip() == want:
            return d.split("/")[3]
    return "vda"


def read_bytes(dev: str) -> int:
    """Bytes the device has read since boot."""
    return int(open(f"/sys/block/{dev}/stat").read().split()[2]) * 512


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process and its waited-for children."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")


def status(sock: str) -> dict:
    """The status of the daemon at sock (riffle status)."""
    from riffle import client
    c = client.Connection(sock, autostart=False)
    try:
        return c.request({"op": "status"})[0]["status"]
    finally:
        c.close()


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Daemon:
    """riffle serve on a private socket, in a memory cgroup (v1) if asked;
    $RIFFLE_BIN names another binary than bin/riffle."""

    def __init__(self, memory: int | None = None, cache: int | None = None, name: str = "riffle-bench"):
        run = Path(f"/tmp/{name}-run")
        run.mkdir(mode=0o700, exist_ok=True)
        os.chmod(run, 0o700)
        self.sock = str(run / "riffle.sock")
        args = [os.environ.get("RIFFLE_BIN", str(REPO / "bin" / "riffle")), "serve", "--socket", self.sock, "--quiet"]
        if cache:
            args += ["--cache-bytes", str(cache)]
        self.cg = None
        if memory:
            self.cg = Path(f"/sys/fs/cgroup/memory/{name}")
            self.cg.mkdir(exist_ok=True)
            (self.cg / "memory.limit_in_bytes").write_text(str(memory))
        if self.cg:
            # Into the cgroup before it starts: the daemon reads its limit
            # at start to split its memory (server/budget.go).
            args = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.cg / "cgroup.procs"), *args]
        self.proc = subprocess.Popen(args)
        from riffle import client
        if not client.wait_for_socket(self.sock, 20):
            raise SystemExit("the daemon did not start")
        self.env = dict(os.environ, RIFFLE_SOCKET=self.sock)

    def status(self) -> dict:
        return status(self.sock)

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def spawn(code: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)


def wait_all(procs: list[subprocess.Popen]) -> list[str]:
    outs = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a client failed: {out}")
        outs.append(out)
    return outs


class GroupWatch:
    """Polls the daemon's status for its groups' counts while jobs run (a
    group goes when its last job does)."""

    def __init__(self, d: Daemon):
        import threading
        self.d, self.best, self.daemon = d, {}, {}
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                st = self.d.status()
            except Exception:
                continue
            for g in st.get("groups") or []:
                b = self.best.setdefault(g["source"], {})
                for k in ("rounds", "given", "saved", "shared"):
                    b[k] = max(b.get(k, 0), g.get(k, 0))
            # The record cache's counts: counters that only grow.
            c = st.get("cache") or {}
            for k in ("hits", "misses", "evictions"):
                self.daemon[k] = max(self.daemon.get(k, 0), c.get(k, 0))

    def totals(self) -> dict:
        self.stop.set()
        self.t.join()
        out = {"rounds": 0, "given": 0, "saved": 0, "shared": 0}
        for b in self.best.values():
            for k in out:
                out[k] += b.get(k, 0)
        out.update({f"cache_{k}": v for k, v in self.daemon.items()})
        return out


def timed(label: str):
    t = time.time()
    return lambda: print(f"  {label}: {time.time() - t:.1f}s", flush=True)


# Self-checking records of variable size: each carries its own id and a
# CRC32 of its payload, so a client can tell a wrong record (another's
# bytes, or bytes cut at the wrong length) without reading the source,
# which would put the client's reads on the device being measured.

# A JSONL line: {"id":"<10 digits>","crc":"<8 hex>","pad":"<letters>"}.
JSONL_HEAD, JSONL_TAIL = 43, 2


def make_jsonl(path: Path, size: int, lo: int = 100, hi: int = 8192, seed: int = 0) -> int:
    """Lines of uniform random length in [lo, hi] bytes (without the
    newline), about size bytes in all; line i carries id i and the CRC32 of
    its pad. Returns the number of lines."""
    if path.exists() and path.stat().st_size >= size * 0.95:
        return sum(1 for _ in open(path, "rb"))
    import zlib
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    letters = rng.integers(ord("a"), ord("z") + 1, 16 << 20, dtype=np.uint8).tobytes()
    n = written = 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        while written < size:
            lens = rng.integers(lo, hi + 1, 4096)
            starts = rng.integers(0, len(letters) - hi, 4096)
            out = []
            for ln, st in zip(lens, starts):
                pad = letters[st : st + ln - JSONL_HEAD - JSONL_TAIL]
                out.append(b'{"id":"%010d","crc":"%08x","pad":"%s"}\n' % (n, zlib.crc32(pad), pad))
                n += 1
            chunk = b"".join(out)
            f.write(chunk)
            written += len(chunk)
    os.replace(tmp, path)
    return n


def check_jsonl(rec, want_id: int) -> bool:
    """Whether rec (a record's bytes, without its newline) is line want_id of a make_jsonl file."""
    import zlib
    r = bytes(rec)
    return (len(r) >= JSONL_HEAD + JSONL_TAIL and r[:7] == b'{"id":"' and r[-2:] == b'"}'
            and r[7:17].isdigit() and int(r[7:17]) == want_id
            and zlib.crc32(r[JSONL_HEAD:-JSONL_TAIL]) == int(r[26:34], 16))


# A file of a make_tree directory: a 16-byte head (its number, its length
# and the CRC32 of the rest, little-endian uint64, uint32, uint32), then
# random bytes.
TREE_HEAD = 16


def make_tree(root: Path, n: int, lo: int = 1 << 10, hi: int = 64 << 10, classes: int = 100, seed: int = 0) -> int:
    """n files of uniform random size in [lo, hi] bytes in an ImageFolder
    tree (root/cNN/NNNNNNN.bin, file i in class i % classes). Returns their
    total size."""
    done = root.with_name(root.name + ".done")  # beside the tree: a file in it would be a record
    if done.exists() and int(done.read_text().split()[0]) == n:
        return int(done.read_text().split()[1])
    import struct
    import zlib
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, 16 << 20, dtype=np.uint8).tobytes()
    for k in range(classes):
        (root / f"c{k:03d}").mkdir(parents=True, exist_ok=True)
    total = 0
    for i in range(n):
        size = int(rng.integers(lo, hi + 1))
        st = int(rng.integers(0, len(noise) - hi))
        body = noise[st : st + size - TREE_HEAD]
        (root / f"c{i % classes:03d}" / f"{i:07d}.bin").write_bytes(struct.pack("<QII", i, size, zlib.crc32(body)) + body)
        total += size
    done.write_text(f"{n} {total}\n")
    return total


def tree_number(path: str) -> int:
    """The number of a make_tree file, from its name."""
    return int(Path(path).stem)


def check_tree(rec, want: int) -> bool:
    """Whether rec (a record's bytes) is the whole of make_tree file number want."""
    import struct
    import zlib
    r = bytes(rec)
    if len(r) < TREE_HEAD:
        return False
    i, size, crc = struct.unpack_from("<QII", r)
    return i == want and size == len(r) and zlib.crc32(r[TREE_HEAD:]) == crc


def process_read_bytes(pid: int) -> int:
    """Bytes a process (all its threads) has caused to be read from storage
    (/proc/PID/io read_bytes): the device reads it made, without those of
    anything else running on the machine."""
    for line in open(f"/proc/{pid}/io"):
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def check_fixed(rec, want_id: int, size: int) -> bool:
    """Whether rec is record want_id of a make_file file of size-byte records."""
    r = bytes(rec)
    return len(r) == size and int.from_bytes(r[:8], "little") == want_id and r[8:].count(0) == size - 8
