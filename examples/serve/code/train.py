"""A training script as SageMaker runs it: hyperparameters as arguments, the rest in SM_*
variables; what it saves in SM_MODEL_DIR becomes model.tar.gz. It fits y = 3x + 1 by
gradient descent, with Python alone."""

import argparse
import json
import os
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

points = [(x / 10, 3 * x / 10 + 1) for x in range(-10, 11)]
w = b = 0.0
for epoch in range(1, args.epochs + 1):
    for _ in range(20):
        grad_w = sum((w * x + b - y) * x for x, y in points) * 2 / len(points)
        grad_b = sum((w * x + b - y) for x, y in points) * 2 / len(points)
        w, b = w - args.lr * grad_w, b - args.lr * grad_b
    loss = sum((w * x + b - y) ** 2 for x, y in points) / len(points)
    print(f"{os.environ['SM_CURRENT_HOST']} epoch {epoch}: loss {loss:.4f}", flush=True)

Path(os.environ["SM_MODEL_DIR"], "model.json").write_text(json.dumps({"w": w, "b": b}))
print(f"saved the model: y = {w:.2f}x + {b:.2f}", flush=True)
