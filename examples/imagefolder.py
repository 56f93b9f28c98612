"""Train a small classifier on an ImageFolder tree through riffle.torch.

The same pipeline as torchvision's ImageFolder + DataLoader(shuffle=True):
only the loader's name changes (torch.utils.data.DataLoader becomes
riffle.torch.loader, its arguments as they were). riffle reads the JPEGs of
the ImageFolder's samples in a global shuffle with many parallel reads;
decoding (as the ImageFolder's loader) and its transform run per sample, in
DataLoader workers, as before.

    python examples/imagefolder.py /data/imagenet/train --epochs 2
"""

import argparse
import time

import torch
import torchvision.datasets as datasets
import torchvision.transforms as T

import riffle.torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    transform = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()])
    dataset = datasets.ImageFolder(args.root, transform)
    # before: torch.utils.data.DataLoader(dataset, batch_size=..., shuffle=True, num_workers=...)
    loader = riffle.torch.loader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    classes = loader.dataset.classes
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, len(classes)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):  # each iteration is the next epoch: no set_epoch needed
        start, seen, total = time.time(), 0, 0.0
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += len(y)
            total += loss.item() * len(y)
        print(f"epoch {epoch}: {seen} images, {len(classes)} classes, loss {total / seen:.3f}, "
              f"{seen / (time.time() - start):.0f} images/s")


if __name__ == "__main__":
    main()
