"""From load_state_dict to the first batch (issue 25): a 10^9-record dataset
(a sparse file of 8-byte records), a state in the middle of an epoch, for
every order; the state is a position, so no order replays the epoch.

    PATH=/usr/local/go/bin:$PATH /usr/bin/python3 bench/resume.py --records 1000000000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

import riffle  # noqa: E402

ORDERS = {
    "global": {},
    "block": {"sampler": "block"},
    "buffered": {"sampler": "buffered", "buffer": 1024},
    "reservoir": {"sampler": "reservoir", "reservoir": 1024},
    "sequential": {"sampler": "sequential"},
    "opportunistic": {"opportunistic": 4},
    # Elastic: every rank's state (riffle.merge_states) on 3 ranks.
    "opportunistic elastic": {"opportunistic": 4},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000_000)
    ap.add_argument("--dir", default="/var/tmp/riffle-resume")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    path = os.path.join(args.dir, "big.bin")
    if not os.path.exists(path) or os.path.getsize(path) != 8 * args.records:
        os.makedirs(args.dir, exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(8 * args.records)  # sparse: reads are zeros, the index is the dataset's size alone
    batch, world = 256, 2
    for name, kw in ORDERS.items():
        times = []
        for r in range(args.repeats):
            # A state from rank 0 of 2, deep in epoch 3, as a checkpoint holds it.
            src = riffle.Loader(path, batch, record_size=8, seed=11, rank=0, world_size=world, **kw)
            it = iter(src)
            next(it)
            state = json.loads(json.dumps(src.state_dict()))
            src.close()
            if name.endswith("elastic"):
                # Both ranks deep in epoch 3, on a window's boundary (a place
                # inside one names the records it delivered of it).
                deep = args.records // 2 // (world * batch) // 4 * 4
                state = riffle.merge_states([dict(state, epoch=3, batch=deep, rank=r, skip=[]) for r in range(world)])
            if "position" in state:
                state["epoch"], state["position"] = 3, args.records // 2 + 12345 * batch
                state["batch"] = state["position"] // (world * batch)
            elastic = "position" in state or "ranks" in state
            ld = riffle.Loader(path, batch, record_size=8, seed=11, rank=1 if elastic else 0, world_size=3 if elastic else world,
                               **kw)
            t0 = time.perf_counter()
            ld.load_state_dict(state)
            b = next(iter(ld))
            times.append(time.perf_counter() - t0)
            assert b.n > 0
            ld.close()
        print(json.dumps({"order": name, "records": args.records, "ms_median": round(statistics.median(times) * 1e3, 1),
                          "ms_max": round(max(times) * 1e3, 1), "elastic": elastic}), flush=True)


if __name__ == "__main__":
    main()
