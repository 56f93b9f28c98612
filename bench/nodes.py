"""Many nodes (issue 15, DeepIO's distributed memory tier): four daemons on
loopback, each in its own memory cgroup (v1), each serving one rank of a
global shuffle of an s3:// dataset on a real S3-compatible server
(versitygw). The dataset is twice one node's memory cgroup and a third
smaller than their sum; each node gives --peer-bytes to the blocks it owns.
Reported per epoch: bytes fetched from the object store (all nodes) over
the dataset's bytes, blocks read from their owners, and wall time.

    sudo .venv/bin/python bench/nodes.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, free_port, make_file, parse_size, status

from riffle import client  # noqa: E402

NODES = 4
RANK = """
import sys, json, time
sys.path.insert(0, {py!r})
import riffle
ld = riffle.Loader({url!r}, batch_size=256, record_size={rs}, seed=3, rank={rank}, world_size={world},
                   socket={sock!r}, autostart=False, timeout=600)
for e in range({epochs}):
    n = 0
    t = time.time()
    for b in ld:
        n += b.n
    print(json.dumps({{"epoch": e, "n": n, "s": time.time() - t}}), flush=True)
    sys.stdin.readline()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp/riffle-nodes")
    ap.add_argument("--memory", default="768MiB", help="one node's memory cgroup")
    ap.add_argument("--record-size", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    mem = parse_size(args.memory)
    data = 2 * mem  # twice one node's memory, a third less than their sum (4 * mem)
    root = Path(args.dir)
    bucket = root / "s3" / "bkt"
    bucket.mkdir(parents=True, exist_ok=True)
    parts = 8
    for k in range(parts):
        make_file(bucket / f"part-{k}.bin", data // parts, args.record_size)
    subprocess.run(["make", "-C", str(REPO), "build"], check=True, stdout=subprocess.DEVNULL)
    gw = shutil.which("versitygw") or os.path.expanduser("~/go/bin/versitygw")
    gw_addr = f"127.0.0.1:{free_port()}"
    gwp = subprocess.Popen([gw, "--access", "ak", "--secret", "sk", "--port", gw_addr, "posix", str(root / "s3")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = dict(os.environ, AWS_ACCESS_KEY_ID="ak", AWS_SECRET_ACCESS_KEY="sk", AWS_REGION="us-east-1",
               RIFFLE_S3_ENDPOINT="http://" + gw_addr, RIFFLE_TOKEN="bench-token")
    time.sleep(1)
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(NODES)]
    peer_bytes = int(data / NODES * 1.2)  # each owns a quarter of the blocks, with room
    daemons, socks, cgs = [], [], []
    for i in range(NODES):
        run = Path(f"/tmp/riffle-node{i}")
        run.mkdir(mode=0o700, exist_ok=True)
        os.chmod(run, 0o700)
        sock = str(run / "riffle.sock")
        cg = Path(f"/sys/fs/cgroup/memory/riffle-node{i}")
        cg.mkdir(exist_ok=True)
        (cg / "memory.limit_in_bytes").write_text(str(mem))
        p = subprocess.Popen([str(REPO / "bin" / "riffle"), "serve", "--socket", sock, "--quiet", "--tcp", addrs[i],
                              "--peers", ",".join(addrs), "--node", str(i), "--peer-bytes", str(peer_bytes),
                              "--cache-bytes", str(64 << 20)], env=env)
        (cg / "cgroup.procs").write_text(str(p.pid))
        daemons.append(p)
        socks.append(sock)
        cgs.append(cg)
    for s in socks:
        if not client.wait_for_socket(s, 20):
            raise SystemExit("a daemon did not start")
    url = "s3://bkt/part-*.bin"
    ranks = []
    for i in range(NODES):
        code = RANK.format(py=str(REPO / "python"), url=url, rs=args.record_size, rank=i, world=NODES, sock=socks[i],
                           epochs=args.epochs)
        p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=env)
        (cgs[i] / "cgroup.procs").write_text(str(p.pid))
        ranks.append(p)
    print(f"{NODES} nodes, each in a {mem >> 20} MiB memory cgroup with {peer_bytes >> 20} MiB for the blocks it owns; "
          f"dataset {data >> 20} MiB of {args.record_size} B records on versitygw (loopback)")
    print(f"  {'epoch':>5} {'wall s':>8} {'samples/s':>10} {'from object store / dataset':>28} {'blocks from owners':>19} {'fallbacks':>10}")
    prev = {"fetched": 0, "from_peers": 0, "fallbacks": 0}
    try:
        for e in range(args.epochs):
            t0 = time.time()
            outs = [json.loads(p.stdout.readline()) for p in ranks]
            wall = time.time() - t0
            sts = [status(s)["peers"] for s in socks]
            cur = {k: sum(s[k] for s in sts) for k in prev}
            n = sum(o["n"] for o in outs)
            print(f"  {e + 1:>5} {wall:>8.1f} {n / wall:>10.0f} {(cur['fetched'] - prev['fetched']) / data:>28.3f} "
                  f"{cur['from_peers'] - prev['from_peers']:>19} {cur['fallbacks'] - prev['fallbacks']:>10}", flush=True)
            prev = cur
            for p in ranks:
                p.stdin.write("\n")
                p.stdin.flush()
    finally:
        for p in ranks + daemons + [gwp]:
            p.kill()
            p.wait()
        for cg in cgs:
            try:
                cg.rmdir()
            except OSError:
                pass


if __name__ == "__main__":
    main()
