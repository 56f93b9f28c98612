"""A language-model pretraining script as torchrun runs one: DDP over gloo, riffle.torch.loader over a mixture of
token corpora whose weights change mid-run (--schedule STEP:W0,W1, or --set-weights STEP:W0,W1: set_weights called in
the training loop after that step, as a script written for it does), a tiny embedding model trained on input_ids and
labels, rank 0's checkpoint every --checkpoint-every steps (the loader's state with the model's), and --resume
going on from a checkpoint on any number of ranks and workers.

Each rank logs one JSON line a step to --log: the step and each sample's input_ids row, for tests/test_pretrain.py.
With --hold-after N, the run stops taking steps after step N and waits to be killed (the test SIGKILLs it)."""

import argparse
import json
import os
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import riffle.torch

parser = argparse.ArgumentParser()
parser.add_argument("sources", nargs=2, help="two Megatron corpora (prefixes)")
parser.add_argument("--seq-len", type=int, default=16)
parser.add_argument("-b", "--batch-size", type=int, default=4, help="per rank")
parser.add_argument("-j", "--workers", type=int, default=2)
parser.add_argument("--seed", type=int, default=7)
parser.add_argument("--schedule", default="", help="STEP:W0,W1 (global steps of the run that began)")
parser.add_argument("--set-weights", default="", help="STEP:W0,W1: loader.set_weights(W) after global step STEP")
parser.add_argument("--checkpoint-every", type=int, default=3)
parser.add_argument("--checkpoint-dir", required=True)
parser.add_argument("--resume", default="")
parser.add_argument("--hold-after", type=int, default=0)
parser.add_argument("--log", required=True)


def main():
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    schedule = [change(args.schedule)] if args.schedule else []
    set_at, set_to = change(args.set_weights) if args.set_weights else (None, None)
    loader = riffle.torch.loader(mixture=[(args.sources[0], 1), (args.sources[1], 1)], seq_len=args.seq_len,
                                 batch_size=args.batch_size, num_workers=args.workers, seed=args.seed,
                                 mixture_schedule=schedule)
    model = nn.Embedding(1 << 16, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    if args.resume:
        ck = torch.load(args.resume)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        loader.load_state_dict(ck["loader"])
        step = ck["step"]
    os.makedirs(args.log, exist_ok=True)
    with open(os.path.join(args.log, f"rank{rank}.jsonl"), "a") as log:
        for batch in loader:
            logits = model(batch["input_ids"]) @ model.weight[:64].T
            loss = (F.cross_entropy(logits.reshape(-1, 64), batch["labels"].reshape(-1) % 64, reduction="none")
                    * batch["loss_mask"].reshape(-1)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == set_at:
                # On every rank at the same step, as DDP code does; from the next step. A run resumed from a later
                # checkpoint never gets here: its state holds the change.
                loader.set_weights(set_to)
            log.write(json.dumps({"step": step, "rows": batch["input_ids"].tolist()}) + "\n")
            log.flush()
            if step % args.checkpoint_every == 0:
                state = loader.state_dict()  # every rank: DDP code calls it on each, rank 0 saves it
                if rank == 0:
                    path = os.path.join(args.checkpoint_dir, f"checkpoint-{step}.pt")
                    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "loader": state,
                                "step": step}, path + ".tmp")
                    os.replace(path + ".tmp", path)
            if args.hold_after and step >= args.hold_after:
                threading.Event().wait()  # until killed


def change(arg: str) -> tuple[int, list[float]]:
    step, ws = arg.split(":")
    return int(step), [float(w) for w in ws.split(",")]


if __name__ == "__main__":
    main()
