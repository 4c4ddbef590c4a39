"""PyTorch reference timings for Armoury's speed comparisons, on whatever machine runs it.

The first PyTorch baselines (docs/reference.md, speed baselines) were measured on an AVX-512 machine; when Armoury
runs on another CPU its speed ratios are only meaningful against PyTorch measured on the same one, side by side.
This script times, with 2 threads and the reference `cnn` (fresh PyTorch init, seed 0), on the full Fashion-MNIST
training set: forward and forward + ∂CE/∂x at batch 1000 (median of 5 after one warm-up), and one epoch (60k
images, batch 128, Adam lr 1e-3) of plain training, Madry PGD-AT (7 steps of 0.025, random start), TRADES β = 6
(7 KL steps of 0.025) and fast AT (FGSM from a random start, step 1.25ε), all at ε = 0.1.

Needs `torch` and `numpy` (`pip install torch numpy`; the figures in docs/reference.md used PyTorch 2.15) and the
full Fashion-MNIST IDX files (`apt-get install dataset-fashion-mnist`, or any directory with the four .gz files).
Run from the repository root:

    python3 benches/reference/pytorch_epochs.py [--data DIR] [--recipes plain,pgd,trades,fast]

Prints one line per workload and a JSON line.
"""
import argparse
import gzip
import json
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(512, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def pgd(model, x, y, eps, step, steps):
    delta = torch.empty_like(x).uniform_(-eps, eps)
    delta = (x + delta).clamp(0, 1) - x
    for _ in range(steps):
        delta.requires_grad_(True)
        loss = F.cross_entropy(model(x + delta), y)
        (g,) = torch.autograd.grad(loss, delta)
        delta = (delta.detach() + step * g.sign()).clamp(-eps, eps)
        delta = (x + delta).clamp(0, 1) - x
    return (x + delta).detach()


def trades_adv(model, x, eps, step, steps):
    with torch.no_grad():
        p_clean = F.softmax(model(x), dim=1)
    xa = (x + 0.001 * torch.randn_like(x)).detach()
    for _ in range(steps):
        xa.requires_grad_(True)
        kl = F.kl_div(F.log_softmax(model(xa), dim=1), p_clean, reduction="sum")
        (g,) = torch.autograd.grad(kl, xa)
        xa = torch.min(torch.max(xa.detach() + step * g.sign(), x - eps), x + eps).clamp(0, 1)
    return xa.detach()


def epoch(recipe, model, opt, xs, ys, eps, batch=128):
    perm = torch.randperm(xs.shape[0])
    start = time.perf_counter()
    for i in range(0, xs.shape[0], batch):
        idx = perm[i : i + batch]
        x, y = xs[idx], ys[idx]
        if recipe == "pgd":
            model.eval()
            x = pgd(model, x, y, eps, 0.025, 7)
            model.train()
            loss = F.cross_entropy(model(x), y)
        elif recipe == "fast":
            x = pgd(model, x, y, eps, 1.25 * eps, 1)
            loss = F.cross_entropy(model(x), y)
        elif recipe == "trades":
            xa = trades_adv(model, x, eps, 0.025, 7)
            logits = model(x)
            kl = F.kl_div(F.log_softmax(model(xa), dim=1), F.softmax(logits, dim=1), reduction="batchmean")
            loss = F.cross_entropy(logits, y) + 6.0 * kl
        else:
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--recipes", default="plain,fast,pgd,trades")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    xs = torch.from_numpy(load_idx(f"{args.data}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    xs = xs.reshape(-1, 1, 28, 28)
    ys = torch.from_numpy(load_idx(f"{args.data}/train-labels-idx1-ubyte.gz").astype(np.int64))
    out = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    model = cnn()
    x, y = xs[:1000], ys[:1000]
    for name, fn in [("forward_b1000_ms", lambda: model(x)),
                     ("forward_input_grad_b1000_ms", lambda: torch.autograd.grad(
                         F.cross_entropy(model(x.clone().requires_grad_(True)), y), model.parameters(),
                         allow_unused=True))]:
        fn()
        times = []
        for _ in range(5):
            t = time.perf_counter()
            if name.startswith("forward_input"):
                xi = x.clone().requires_grad_(True)
                torch.autograd.grad(F.cross_entropy(model(xi), y), xi)
            else:
                with torch.no_grad():
                    model(x)
            times.append((time.perf_counter() - t) * 1e3)
        out[name] = sorted(times)[2]
        print(f"{name}: {out[name]:.1f}")
    for recipe in args.recipes.split(","):
        torch.manual_seed(0)
        model = cnn()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        secs = epoch(recipe, model, opt, xs, ys, 0.1)
        out[f"{recipe}_epoch_s"] = secs
        print(f"{recipe} epoch: {secs:.1f} s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
