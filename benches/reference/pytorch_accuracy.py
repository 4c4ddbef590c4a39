"""How much PyTorch's own accuracy varies with the seed, for the adversarial-training recipes Armoury is compared on.

The comparisons (docs/reference.md, adversarial training) set one Armoury run against one PyTorch run (seed 0). Both
sides draw the initial weights, the batch order and the random starts from their seed, so one run is one sample of a
distribution; this script shows that distribution on PyTorch's side: the same recipe (10 epochs, fresh cnn, Adam
lr 1e-3, batch 128, ε = 0.1) for several seeds, clean accuracy on the 10k test images and PGD-40 robust accuracy
(steps of 0.01 from a random start) on the first 2000.

Needs `torch` and `numpy` (`pip install torch numpy`) and the full Fashion-MNIST IDX files (`--data DIR`, default
the Debian package's directory). It imports its helpers from pytorch_epochs.py beside it. From the repository root:

    python3 benches/reference/pytorch_accuracy.py [--data DIR] --recipe fast --seeds 0,1,2

Prints one line per seed and a JSON line.
"""
import argparse
import json
import time

import numpy as np
import torch

from pytorch_epochs import cnn, epoch, load_idx, pgd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--recipe", default="fast")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(2)

    def images(name):
        x = load_idx(f"{args.data}/{name}-images-idx3-ubyte.gz").astype(np.float32) / 255.0
        return torch.from_numpy(x).reshape(-1, 1, 28, 28)

    def labels(name):
        return torch.from_numpy(load_idx(f"{args.data}/{name}-labels-idx1-ubyte.gz").astype(np.int64))

    xs, ys, xt, yt = images("train"), labels("train"), images("t10k"), labels("t10k")
    runs = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        torch.manual_seed(seed)
        model = cnn()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        start = time.perf_counter()
        for _ in range(args.epochs):
            model.train()
            epoch(args.recipe, model, opt, xs, ys, 0.1)
        train_s = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            clean = sum((model(xt[i : i + 1000]).argmax(1) == yt[i : i + 1000]).sum().item() for i in range(0, 10000, 1000))
        robust = 0
        for i in range(0, 2000, 500):
            xa = pgd(model, xt[i : i + 500], yt[i : i + 500], 0.1, 0.01, 40)
            with torch.no_grad():
                robust += (model(xa).argmax(1) == yt[i : i + 500]).sum().item()
        run = {"seed": seed, "clean_accuracy": clean / 10000, "robust_accuracy_pgd40": robust / 2000, "train_s": train_s}
        runs.append(run)
        print(f"seed {seed}: clean {run['clean_accuracy']:.4f}  PGD-40 {run['robust_accuracy_pgd40']:.4f}  ({train_s:.0f} s)")
    print(json.dumps({"recipe": args.recipe, "epochs": args.epochs, "torch": torch.__version__, "runs": runs}))


if __name__ == "__main__":
    main()
