"""Many nodes on real network stacks (issue 46): one epoch's time under each
fault against the healthy run, in one run.

Three nodes as network namespaces on a bridge (python/tests/netns.py), each
with its riffle daemon (--peers, --peer-timeout) and torchrun (c10d
rendezvous, DDP over gloo), ranks reading an s3:// dataset on versitygw (a
namespace of its own) through riffle.torch. Each case is a fresh cluster
and one epoch, with the fault after step --pause-at: none (healthy), node 2
cut off (its packets dropped), node 2's daemon killed for good (its node
drained), restarted empty, or its link shaped (tbf). A lost node's ranks
are replaced by torchrun's elastic restart on the two others, resuming from
the last checkpoint (python/tests/test_netns.py says what exact means
then); every case's epoch is checked exact against a solo read.

The epoch's time runs from the first rank's first batch request to the last
batch training kept, less the harness's pause; for a lost node it includes
the time DDP takes to notice (its collective timeout), torchrun's new
rendezvous and the workers' restart (shown apart: from the last batch
before the failure to the first after the resume). Also shown: the object
store's bytes the two other daemons fetched, over the dataset's, their
fallbacks (reads of a block from the store because its owner failed), and
the longest a rank of theirs waited for a batch other than a job's first.

    sudo .venv/bin/python bench/netns.py
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

from common import REPO

sys.path.insert(0, str(REPO / "python" / "tests"))
import netns  # noqa: E402

CASES = ("healthy", "cut", "kill", "restart", "slow")


def run_case(case: str, work: Path, args, solo: dict | None) -> dict:
    c = netns.Cluster(work / case, nodes=3, ranks=args.ranks, peer_timeout=args.peer_timeout)
    try:
        url = c.dataset("ds", args.records, args.record_size)
        solo = solo or c.solo(url, args.record_size)
        out = work / case / "out"
        lost = case in ("cut", "kill")
        train = ["--url", url, "--record-size", str(args.record_size), "--batch", str(args.batch),
                 "--pause-at", str(args.pause_at), "--reconnect", str(args.peer_timeout)]
        if args.prefetch:
            train += ["--prefetch", str(args.prefetch)]
        c.launch(out, train, min_nodes=2 if lost else None, max_restarts=2 if lost else 0,
                 gloo_timeout=max(6 * args.peer_timeout, 15.0))
        c.wait_at(out, args.pause_at, 3 * args.ranks, timeout=300)
        paused = time.time()
        c.go(out)
        went = time.time()
        node = c.nodes[2]
        if case == "cut":
            c.cut(node)
        elif case == "kill":
            node.kill_daemon()
            netns.wait_gone(out, node.index)
            c.stop_torchrun(node)
        elif case == "restart":
            node.restart_daemon()
        elif case == "slow":
            c.slow(node, args.slow, into=False)
        alive = c.nodes[:2] if lost else c.nodes
        c.wait_done(alive, timeout=600)
        attempts, batches = netns.check_epoch(out, solo)
        start = min(r["started"] for a in attempts.values() for r in a["ranks"].values() if a["resumed"] is None)
        end = max(b["t"] for b in batches)
        # How long training stood still: from the last batch of the attempt
        # that met the fault to the first of the one that resumed.
        first = [a for a in attempts.values() if a["resumed"] is None][0]
        later = [b["t"] for a in attempts.values() if a["resumed"] is not None for b in a["batches"]]
        stood = min(later) - max(b["t"] for b in first["batches"]) if later else 0.0
        st = [n.status()["peers"] for n in c.nodes[:2]]
        _, rest = netns.waits(attempts, {0, 1})
        return {"case": case, "epoch_s": end - start - (went - paused), "attempts": len(attempts),
                "fetched": sum(s["fetched"] for s in st) / (args.records * args.record_size),
                "fallbacks": sum(s["fallbacks"] for s in st), "max_wait_s": rest, "stood_s": stood, "solo": solo}
    finally:
        c.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp/riffle-netns")
    ap.add_argument("--records", type=int, default=12000)
    ap.add_argument("--record-size", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=2, help="ranks per node")
    ap.add_argument("--pause-at", type=int, default=10, help="the step after which the fault comes")
    ap.add_argument("--peer-timeout", type=float, default=2.0)
    ap.add_argument("--prefetch", type=int, default=0, help="batches each daemon reads ahead (0: its own choice)")
    ap.add_argument("--slow", default="10mbit", help="the shaped node's rate out (tbf)")
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    err = netns.available()
    if err:
        raise SystemExit(f"bench/netns.py: {err}")
    work = Path(args.dir) / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    mib = args.records * args.record_size / (1 << 20)
    print(f"3 nodes (network namespaces) x {args.ranks} ranks, DDP over gloo by torchrun; {args.records} records of "
          f"{args.record_size} B ({mib:.0f} MiB, 3 objects) on versitygw; batch {args.batch}, fault after step "
          f"{args.pause_at}, --peer-timeout {args.peer_timeout}s; {datetime.date.today()}", flush=True)
    print(f"  {'case':<9} {'epoch s':>8} {'x healthy':>10} {'attempts':>9} {'store/dataset':>14} "
          f"{'fallbacks':>10} {'max wait s':>11} {'restart s':>10}", flush=True)
    solo, base = None, None
    for case in args.cases.split(","):
        r = run_case(case, work, args, solo)
        solo = r["solo"]
        if case == "healthy":
            base = r["epoch_s"]
        ratio = f"{r['epoch_s'] / base:.2f}" if base else "-"
        print(f"  {case:<9} {r['epoch_s']:>8.1f} {ratio:>10} {r['attempts']:>9} {r['fetched']:>14.2f} "
              f"{r['fallbacks']:>10} {r['max_wait_s']:>11.2f} {r['stood_s']:>10.1f}", flush=True)


if __name__ == "__main__":
    main()
