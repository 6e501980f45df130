"""A tiny regression, trained and then served by the same script (as SDK v2 deploys it).

Training runs under ``__main__``; the model server imports this module for ``model_fn`` and
uses the default PyTorch handlers for the rest (float32 numpy in, numpy out).
"""

import os

import torch


def model_fn(model_dir):
    return torch.jit.load(os.path.join(model_dir, "model.pt"), map_location="cpu")


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(256, 2)
    y = x @ torch.tensor([[3.0], [-1.0]]) + 0.5
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(100):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if epoch % 20 == 0:
            print(f"epoch={epoch} loss={loss.item():.5f}", flush=True)
    torch.jit.save(torch.jit.script(model), os.path.join(os.environ["SM_MODEL_DIR"], "model.pt"))
