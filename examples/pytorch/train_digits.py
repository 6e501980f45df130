"""Data-parallel training of a small classifier on scikit-learn's 8x8 digits.

Written for the ``torch.distributed`` API with Shoal's ``shoal`` backend: each rank trains on
its shard of the training set, DistributedDataParallel averages the gradients, rank 0 saves
the model to ``SM_MODEL_DIR``. Runs unchanged on SageMaker and in Shoal's local mode.
"""

import argparse
import json
import os
import time

import numpy as np
import shoal.dataparallel.torch  # noqa: F401  (registers the "shoal" backend)
import torch
import torch.distributed as dist
from torch import nn


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "model"))
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAIN"))
    return parser.parse_args()


def load_data(channel):
    """(x_train, y_train, x_test, y_test): from the train channel's digits.npz, else scikit-learn."""
    if channel and os.path.exists(os.path.join(channel, "digits.npz")):
        data = np.load(os.path.join(channel, "digits.npz"))
        return data["x_train"], data["y_train"], data["x_test"], data["y_test"]
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x / 16.0, y, test_size=0.2, random_state=0, stratify=y)
    return x_train, y_train, x_test, y_test


def make_model():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def main():
    args = parse_args()
    dist.init_process_group(backend="shoal")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # ranks share the cores

    x_train, y_train, x_test, y_test = load_data(args.train)
    x = torch.tensor(x_train[rank::world], dtype=torch.float32)  # this rank's shard
    y = torch.tensor(y_train[rank::world], dtype=torch.long)

    model = nn.parallel.DistributedDataParallel(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * world)  # linear scaling rule
    loss_fn = nn.CrossEntropyLoss()
    steps = len(x) // args.batch_size
    if rank == 0:
        print(f"world size {world}, {len(x_train)} training samples, {steps} steps per epoch")

    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        total = torch.zeros(1)
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            total += loss.detach()
        dist.all_reduce(total)
        elapsed = time.perf_counter() - start
        if rank == 0:
            samples = steps * args.batch_size * world
            print(f"epoch {epoch:2d}  loss {total.item() / steps / world:.4f}  "
                  f"throughput {samples / elapsed:,.0f} samples/s")

    # Held-out accuracy: every rank scores its shard of the test set, then one all_reduce.
    net = model.module.eval()
    xt = torch.tensor(x_test[rank::world], dtype=torch.float32)
    yt = torch.tensor(y_test[rank::world], dtype=torch.long)
    with torch.no_grad():
        counts = torch.tensor([(net(xt).argmax(1) == yt).sum().item(), len(yt)], dtype=torch.float32)
    dist.all_reduce(counts)
    accuracy = counts[0].item() / counts[1].item()
    if rank == 0:
        print(f"held-out accuracy {accuracy:.4f}")
        os.makedirs(args.model_dir, exist_ok=True)
        torch.save(net.state_dict(), os.path.join(args.model_dir, "model.pt"))
        with open(os.path.join(args.model_dir, "metrics.json"), "w") as f:
            json.dump({"accuracy": accuracy, "world_size": world}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
