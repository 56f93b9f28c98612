"""One rank of a training job across the nodes of netns.py, as torchrun starts it.

DDP (gloo) over a tiny model, fed by riffle.torch reading an s3:// dataset
through this node's daemon. Rank 0 saves a checkpoint (the loader's state)
after every step, the way a user's script does every so often; a rank
started again by torchrun's elastic restart resumes from it, on whatever
world the rendezvous made, and goes on to the end of the epoch.

Each rank writes ``OUT/ATTEMPT-rRANK.jsonl``: a header (the attempt, its
world, the checkpoint it resumed from), one line per batch (the step, each
record's id and a digest of its bytes, how long the rank waited for it),
and a last line once its epoch is done (or once its daemon is gone). The
ids are the records' own first 8 bytes (the tests' datasets begin every
record with its id).

With ``--pause-at S`` the first attempt's ranks stop after step S until
the file OUT/go exists, having each made OUT/at-S-RANK: the harness puts
its fault there, in the middle of the epoch, and lets them go.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
import uuid
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import riffle
import riffle.torch
from netns import digest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--record-size", type=int, required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--node", type=int, required=True)
    ap.add_argument("--gloo-timeout", type=float, default=60)
    ap.add_argument("--reconnect", type=float, default=60)
    ap.add_argument("--prefetch", type=int, default=None)
    ap.add_argument("--pause-at", type=int, default=-1)
    a = ap.parse_args()
    out = Path(a.out)

    # Setting up, and a job's first batch (its open), come under the
    # default group's long timeout; DDP's collectives then time out after
    # --gloo-timeout: how long the other ranks wait for a node that was cut
    # off before they fail and torchrun restarts them.
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    box = [uuid.uuid4().hex[:10] if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    attempt = box[0]

    # Every rank reads the checkpoint before the first step's collective,
    # and rank 0 writes the next only after it: all resume from one place.
    ckpt = out / "ckpt.pt"
    resumed = frm = state = None
    if ckpt.exists():
        c = torch.load(ckpt)
        resumed, frm, state = c["step"], c["attempt"], c["state"]
    loader = riffle.torch.loader(a.url, batch_size=a.batch, record_size=a.record_size, seed=a.seed,
                                 socket=a.socket, autostart=False, reconnect=a.reconnect, prefetch=a.prefetch)
    if state is not None:
        loader.load_state_dict(state)
    log = open(out / f"{attempt}-r{rank}.jsonl", "w", buffering=1)
    log.write(json.dumps({"attempt": attempt, "rank": rank, "world": world, "node": a.node, "resumed": resumed,
                          "from": frm, "pid": os.getpid()}) + "\n")

    it = iter(loader)
    log.write(json.dumps({"started": time.time()}) + "\n")

    def batch():
        t = time.monotonic()
        try:
            return next(it), time.monotonic() - t
        except StopIteration:
            return None, time.monotonic() - t
        except riffle.DaemonGone as e:
            # This node's daemon is gone for good: the rank cannot read.
            # It says so and waits to be stopped with its node (what drains
            # the node stops its torchrun, which stops it).
            log.write(json.dumps({"gone": str(e), "after": time.monotonic() - t}) + "\n")
            while True:
                signal.pause()

    b, wait = batch()
    dist.barrier()
    group = dist.new_group(timeout=timedelta(seconds=a.gloo_timeout))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    step = resumed + 1 if resumed is not None else 0
    # join: after a resume on another world the ranks' shares of the rest
    # of the epoch may differ by a batch; DDP's join shadows the
    # collectives of the ranks that ran out.
    with model.join():
        while b is not None:
            rows = b.numpy()
            ids = rows[:, :8].copy().view("<u8").ravel().tolist()
            dig = [digest(r.tobytes()) for r in rows]
            log.write(json.dumps({"step": step, "ids": ids, "dig": dig, "wait": wait, "t": time.time()}) + "\n")
            x = b[:, 8:16].float() / 255
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()  # DDP's allreduce: every rank has its batch of this step
            opt.step()
            if rank == 0:
                tmp = out / f"ckpt.{attempt}.tmp"
                torch.save({"step": step, "attempt": attempt, "state": loader.state_dict()}, tmp)
                os.replace(tmp, ckpt)
            if step == a.pause_at and resumed is None:
                (out / f"at-{step}-{rank}").touch()
                while not (out / "go").exists():
                    time.sleep(0.02)
            step += 1
            b, wait = batch()
    log.write(json.dumps({"done": True}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
