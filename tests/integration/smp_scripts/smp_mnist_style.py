"""An SMP v1 training script in the style of SageMaker's public MNIST example for the model
parallel library (pt_mnist.py): a CNN, ``smp.amp.GradScaler``, Adadelta with StepLR, a train
and a test ``smp.step``, data sharded by ``smp.dp_rank()`` when ``ddp`` is on, partial
checkpoints from ``dp_rank() == 0``. Only its CUDA device lines differ (``device = cpu``).
The data are scikit-learn's 8x8 digits, upsampled to 16x16, from the ``train`` channel."""

import argparse
import os

import numpy as np
import smdistributed.modelparallel.torch as smp
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR


class Net1(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return torch.flatten(F.max_pool2d(x, 2), 1)


class Net2(nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout = nn.Dropout(0.0)
        self.fc1 = nn.Linear(32 * 6 * 6, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.fc1(self.dropout(x)))
        return F.log_softmax(self.fc2(x), 1)


class GroupedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = Net1()
        self.net2 = Net2()

    def forward(self, x):
        return self.net2(self.net1(x))


@smp.step
def train_step(model, scaler, data, target):
    output = model(data)
    loss = F.nll_loss(output, target, reduction="mean")
    scaled_loss = scaler.scale(loss)
    model.backward(scaled_loss)
    return output, loss


def train(model, scaler, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        _, loss_mb = train_step(model, scaler, data, target)
        loss = loss_mb.reduce_mean()
        scaler.step(optimizer)
        scaler.update()
        if smp.rank() == 0 and batch_idx % 10 == 0:
            print(f"Train Epoch: {epoch} [{batch_idx}] loss: {loss.item():.6f}", flush=True)


@smp.step
def test_step(model, data, target):
    output = model(data)
    loss = F.nll_loss(output, target, reduction="sum").item()
    pred = output.argmax(dim=1, keepdim=True)
    correct = pred.eq(target.view_as(pred)).sum().item()
    return loss, correct


def test(model, device, test_loader):
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            loss_batch, correct_batch = test_step(model, data, target)
            test_loss += sum(loss_batch)
            correct += sum(correct_batch)
    test_loss /= len(test_loader.dataset)
    if smp.mp_rank() == 0:
        print(f"Test set: Average loss: {test_loss:.4f}, Accuracy: "
              f"{correct}/{len(test_loader.dataset)}", flush=True)
    return test_loss, correct / len(test_loader.dataset)


def loaders(batch_size, ddp):
    data = np.load(os.path.join(os.environ.get("SM_CHANNEL_TRAIN", "."), "digits.npz"))
    def dataset(x, y):
        images = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8)
        images = F.interpolate(images, size=16)
        return torch.utils.data.TensorDataset(images, torch.tensor(y))
    train_set = dataset(data["x_train"], data["y_train"])
    test_set = dataset(data["x_test"], data["y_test"])
    if ddp:  # each data-parallel replica trains on its own share
        indices = list(range(smp.dp_rank(), len(train_set), smp.dp_size()))
        train_set = torch.utils.data.Subset(train_set, indices)
    kwargs = {"batch_size": batch_size, "shuffle": False, "drop_last": True}
    return (torch.utils.data.DataLoader(train_set, **kwargs),
            torch.utils.data.DataLoader(test_set, **kwargs))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    args, _ = parser.parse_known_args()

    smp.init()
    torch.manual_seed(args.seed)
    device = torch.device("cpu")  # SageMaker's script: torch.device("cuda")
    train_loader, test_loader = loaders(args.batch_size, smp.state.cfg.ddp)

    model = GroupedNet()
    scaler = smp.amp.GradScaler()
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    model = smp.DistributedModel(model)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    optimizer = smp.DistributedOptimizer(optimizer)

    for epoch in range(1, args.epochs + 1):
        train(model, scaler, device, train_loader, optimizer, epoch)
        test_loss, accuracy = test(model, device, test_loader)
        scheduler.step()

    if smp.rank() == 0:
        print(f"final accuracy {accuracy:.4f}", flush=True)
    if smp.dp_rank() == 0:
        model_dict = model.local_state_dict()
        opt_dict = optimizer.local_state_dict()
        model_dir = os.environ.get("SM_MODEL_DIR", "/tmp")
        smp.save({"model_state_dict": model_dict, "optimizer_state_dict": opt_dict},
                 os.path.join(model_dir, "model_checkpoint.pt"), partial=True)
    smp.barrier()


if __name__ == "__main__":
    main()
