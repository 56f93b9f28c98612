"""A Hugging Face-style training script, as the datasets and transformers
examples write one: load_from_disk, a with_transform function that makes
pixel_values of a batch of PIL images with torchvision transforms, a
ClassLabel column, DataLoader's default collate; ported to riffle by its
loader line alone (--loader riffle), and its DataLoader twin (--loader
torch). It checkpoints every --checkpoint-every steps, the loader's state
with the model's, and --resume goes on from a checkpoint.

It logs what it trained on to --log (one JSON line a step: the epoch, the
step, each sample's id, label and a hash of its tensor) for
tests/test_ports.py."""

import argparse
import hashlib
import json
import os

import datasets
import torch
import torch.nn as nn
import torch.utils.data
import torchvision.transforms as transforms

import riffle.torch

parser = argparse.ArgumentParser(description="Hugging Face-style image classification, ported to riffle")
parser.add_argument("data", help="a directory datasets' save_to_disk wrote")
parser.add_argument("--split", default="train")
parser.add_argument("--epochs", default=2, type=int)
parser.add_argument("-b", "--batch-size", default=8, type=int)
parser.add_argument("-j", "--workers", default=2, type=int)
parser.add_argument("--lr", default=0.01, type=float)
parser.add_argument("--seed", default=0, type=int)
parser.add_argument("--resume", default="")
parser.add_argument("--loader", choices=("riffle", "torch"), default="riffle")
parser.add_argument("--checkpoint-every", default=4, type=int, help="steps")
parser.add_argument("--checkpoint-dir", default=".")
parser.add_argument("--log", required=True, help="a file for the log of samples")

MEAN, STD = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]


def main():
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    dataset = datasets.load_from_disk(args.data)[args.split]
    labels = dataset.features["label"].names
    train_transforms = transforms.Compose([transforms.Resize((12, 12)), transforms.ToTensor(),
                                           transforms.Normalize(mean=MEAN, std=STD)])

    def preprocess(batch):
        return {"pixel_values": [train_transforms(image.convert("RGB")) for image in batch["image"]],
                "label": batch["label"]}

    train_dataset = dataset.with_transform(preprocess)
    if args.loader == "riffle":
        loader = riffle.torch.loader(train_dataset, batch_size=args.batch_size, shuffle=True,
                                     num_workers=args.workers)
    else:
        loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True,
                                             num_workers=args.workers)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 12 * 12, len(labels)))
    optimizer = torch.optim.SGD(model.parameters(), args.lr)
    start_epoch, first, step = 0, 0, 0
    if args.resume:
        checkpoint = torch.load(args.resume)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        loader.load_state_dict(checkpoint["loader"])
        start_epoch, first, step = checkpoint["epoch"], checkpoint["epoch_step"], checkpoint["step"]
    log = open(args.log, "a")
    for epoch in range(start_epoch, args.epochs):
        log.write(json.dumps({"epoch": epoch, "len": len(loader)}) + "\n")
        for i, batch in enumerate(loader, first if epoch == start_epoch else 0):
            loss = nn.functional.cross_entropy(model(batch["pixel_values"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            log.write(json.dumps({"epoch": epoch, "i": i, "step": step, "ids": sample_ids(batch["pixel_values"]),
                                  "labels": batch["label"].tolist(), "hashes": hashes(batch["pixel_values"])}) + "\n")
            log.flush()
            if step % args.checkpoint_every == 0 and args.loader == "riffle":
                state = {"epoch": epoch, "epoch_step": i + 1, "step": step, "model": model.state_dict(),
                         "optimizer": optimizer.state_dict(), "loader": loader.state_dict()}
                path = os.path.join(args.checkpoint_dir, f"checkpoint-{step}.pt")
                torch.save(state, path + ".tmp")
                os.replace(path + ".tmp", path)
    log.close()


def sample_ids(pixels):
    """Each image's id: the test's images are of one colour each, whose red is 5 x id."""
    return [int(round((float(x[0, 0, 0]) * STD[0] + MEAN[0]) * 255 / 5)) for x in pixels]


def hashes(pixels):
    return [hashlib.blake2b(x.numpy().tobytes(), digest_size=8).hexdigest() for x in pixels]


if __name__ == "__main__":
    main()
