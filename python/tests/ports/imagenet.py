"""An ImageNet-style training script, as PyTorch's examples/imagenet/main.py
is written (argparse; DDP launched by torchrun or by mp.spawn with
--multiprocessing-distributed; an ImageFolder; a DistributedSampler built
from it before the loader; set_epoch at each epoch's start), ported to
riffle by its loader line alone (--loader riffle), and its DataLoader twin
(--loader torch). It checkpoints every --checkpoint-every steps, the
loader's state with the model's, and --resume goes on from a checkpoint.

Each rank logs what it trained on to --log (one JSON line a step: the
epoch, the step, each sample's id, label and a hash of its tensor) for
tests/test_ports.py. The model is trivial and the images tiny: the test is
of the data, not of the training."""

import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.utils.data
import torch.utils.data.distributed
import torchvision.datasets as datasets
import torchvision.transforms as transforms

import riffle.torch

parser = argparse.ArgumentParser(description="ImageNet-style training, ported to riffle")
parser.add_argument("data", metavar="DIR", help="a directory of class folders")
parser.add_argument("-j", "--workers", default=2, type=int, help="DataLoader workers")
parser.add_argument("--epochs", default=3, type=int)
parser.add_argument("--start-epoch", default=0, type=int)
parser.add_argument("-b", "--batch-size", default=4, type=int, help="per rank")
parser.add_argument("--lr", default=0.01, type=float)
parser.add_argument("--resume", default="", type=str, help="a checkpoint to go on from")
parser.add_argument("--world-size", default=-1, type=int)
parser.add_argument("--rank", default=-1, type=int)
parser.add_argument("--dist-url", default="env://", type=str)
parser.add_argument("--dist-backend", default="gloo", type=str)
parser.add_argument("--seed", default=None, type=int)
parser.add_argument("--multiprocessing-distributed", action="store_true",
                    help="mp.spawn a process for each of --world-size ranks (the example starts one per GPU)")
parser.add_argument("--loader", choices=("riffle", "torch"), default="riffle")
parser.add_argument("--checkpoint-every", default=4, type=int, help="steps")
parser.add_argument("--checkpoint-dir", default=".")
parser.add_argument("--log", required=True, help="a directory for each rank's log of samples")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def main():
    args = parser.parse_args()
    if args.seed is not None:
        torch.manual_seed(args.seed)
    if args.dist_url == "env://" and args.world_size == -1:
        args.world_size = int(os.environ.get("WORLD_SIZE", 1))
    args.distributed = args.world_size > 1 or args.multiprocessing_distributed
    if args.multiprocessing_distributed:
        mp.spawn(main_worker, nprocs=args.world_size, args=(args,))
    else:
        main_worker(None, args)


def main_worker(local, args):
    if args.distributed:
        if args.dist_url == "env://" and args.rank == -1:
            args.rank = int(os.environ.get("RANK", 0))
        if args.multiprocessing_distributed:
            args.rank = local
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url, world_size=args.world_size,
                                rank=args.rank)
    rank = args.rank if args.distributed else 0
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 12 * 12, 3))
    if args.distributed:
        model = nn.parallel.DistributedDataParallel(model)
    else:
        model = nn.DataParallel(model)  # as the example: its state's keys are the same either way
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr)
    checkpoint = None
    if args.resume:
        checkpoint = torch.load(args.resume)
        args.start_epoch = checkpoint["epoch"]
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])

    train_dataset = datasets.ImageFolder(args.data, transforms.Compose([
        transforms.Resize((12, 12)),
        transforms.ToTensor(),
        transforms.Normalize(mean=MEAN, std=STD),
    ]))
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
    else:
        train_sampler = None
    if args.loader == "riffle":
        train_loader = riffle.torch.loader(
            train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
            num_workers=args.workers, pin_memory=True, sampler=train_sampler)
    else:
        train_loader = torch.utils.data.DataLoader(
            train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
            num_workers=args.workers, pin_memory=True, sampler=train_sampler)
    if checkpoint is not None and "loader" in checkpoint:
        train_loader.load_state_dict(checkpoint["loader"])

    log = open(os.path.join(args.log, f"rank{rank}.jsonl"), "a")
    step = checkpoint["step"] if checkpoint is not None else 0  # steps of every epoch so far
    for epoch in range(args.start_epoch, args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        first = checkpoint["epoch_step"] if checkpoint is not None and epoch == checkpoint["epoch"] else 0
        log.write(json.dumps({"epoch": epoch, "len": len(train_loader), "first": first}) + "\n")
        step = train(train_loader, model, criterion, optimizer, epoch, first, step, args, log)
    log.close()
    if args.distributed:
        dist.destroy_process_group()


def train(train_loader, model, criterion, optimizer, epoch, first, step, args, log):
    model.train()
    for i, (images, target) in enumerate(train_loader, first):
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        log.write(json.dumps({"epoch": epoch, "i": i, "step": step, "ids": sample_ids(images),
                              "labels": target.tolist(), "hashes": hashes(images)}) + "\n")
        log.flush()
        if step % args.checkpoint_every == 0 and (not args.distributed or args.rank == 0):
            state = {"epoch": epoch, "epoch_step": i + 1, "step": step, "state_dict": model.state_dict(),
                     "optimizer": optimizer.state_dict()}
            if args.loader == "riffle":
                state["loader"] = train_loader.state_dict()
            save_checkpoint(state, os.path.join(args.checkpoint_dir, f"checkpoint-{step}.pth.tar"))
    return step


def save_checkpoint(state, filename):
    torch.save(state, filename + ".tmp")
    os.replace(filename + ".tmp", filename)


def sample_ids(images):
    """Each image's id: the test's images are of one colour each, whose red is 5 x id."""
    mean, std = torch.tensor(MEAN).view(1, 3), torch.tensor(STD).view(1, 3)
    rgb = (images[:, :, 0, 0] * std + mean) * 255
    return [int(round(float(r) / 5)) for r in rgb[:, 0]]


def hashes(images):
    return [hashlib.blake2b(x.numpy().tobytes(), digest_size=8).hexdigest() for x in images]


if __name__ == "__main__":
    main()
