"""A training script written for SageMaker's ``smdistributed.dataparallel`` PyTorch API
(the module API with its own DistributedDataParallel wrapper), left unchanged: Shoal provides
the ``smdistributed`` package, so the same file runs on Shoal's runtime.

Trains a small classifier on scikit-learn's 8x8 digits (the ``train`` channel's
``digits.npz`` when given, else the copy bundled with scikit-learn).
"""

import argparse
import os

import numpy as np
import smdistributed.dataparallel.torch.distributed as dist
import torch
import torch.nn.functional as F
from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP
from torch import nn

dist.init_process_group()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def load_data(channel):
    if channel and os.path.exists(os.path.join(channel, "digits.npz")):
        data = np.load(os.path.join(channel, "digits.npz"))
        return data["x_train"], data["y_train"], data["x_test"], data["y_test"]
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x / 16.0, y, test_size=0.2, random_state=0, stratify=y)
    return x_train, y_train, x_test, y_test


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--model-dir", type=str, default=os.environ.get("SM_MODEL_DIR", "model"))
    parser.add_argument("--train", type=str, default=os.environ.get("SM_CHANNEL_TRAIN"))
    args = parser.parse_args()

    world_size = dist.get_world_size()
    rank = dist.get_rank()
    local_rank = dist.get_local_rank()
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    torch.manual_seed(0)

    if rank == 0:
        print(f"world size {world_size}")
    x_train, y_train, x_test, y_test = load_data(args.train)
    x = torch.tensor(x_train[rank::world_size], dtype=torch.float32)
    y = torch.tensor(y_train[rank::world_size], dtype=torch.long)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=args.batch_size, shuffle=True,
        drop_last=True)

    model = DDP(Net().to(device))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * world_size)
    for epoch in range(1, args.epochs + 1):
        model.train()
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"Train Epoch: {epoch} Loss: {loss.item():.6f}")

    if rank == 0:
        model.eval()
        with torch.no_grad():
            xt = torch.tensor(x_test, dtype=torch.float32).to(device)
            correct = (model(xt).argmax(1).cpu() == torch.tensor(y_test)).sum().item()
        print(f"Test accuracy: {correct / len(y_test):.4f}")
        torch.save(model.state_dict(), os.path.join(args.model_dir, "model.pt"))


if __name__ == "__main__":
    main()
