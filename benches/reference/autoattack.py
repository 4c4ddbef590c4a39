"""AutoAttack's own robust accuracy for a cnn trained by Armoury: the strength and speed reference of the
`evaluate` example's cascade (docs/evaluation.md, docs/reference.md).

Runs torchattacks 3.5.1 `AutoAttack(version="standard")` (APGD-CE, APGD-T, FAB-T, Square 5,000 queries, as in
Croce & Hein's standard protocol) on the weights of an Armoury safetensors file (the reference cnn is the same
`nn.Sequential`; its layer names conv1, conv2, fc1, fc2 are mapped to the Sequential's indices) and on the first N test images of an IDX directory (default: the Fashion-MNIST
sample embedded in the repository, whose test images are the first 1,000 of the full test set).

Needs `pip install torch torchattacks==3.5.1 safetensors numpy`. From the repository root:

    python3 benches/reference/autoattack.py --weights out/pgd-cnn.safetensors --eps 0.1 --limit 1000

Prints one JSON line: clean and robust accuracy, seconds (2 threads), versions.
"""
import argparse
import json
import time

import numpy as np
import torch
import torchattacks
from safetensors.torch import load_file

from pytorch_epochs import cnn, load_idx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--data", default="data/fashion-mnist-sample")
    ap.add_argument("--eps", type=float, default=0.1)
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = cnn()
    # Armoury's cnn names its layers conv1, conv2, fc1, fc2; PyTorch's Sequential numbers them.
    names = {"conv1": "0", "conv2": "3", "fc1": "7", "fc2": "9"}
    state = {names.get(k.split(".")[0], k.split(".")[0]) + "." + k.split(".", 1)[1]: v
             for k, v in load_file(args.weights).items()}
    model.load_state_dict(state)
    model.eval()
    x = load_idx(f"{args.data}/t10k-images-idx3-ubyte.gz")[: args.limit].astype(np.float32) / 255.0
    x = torch.from_numpy(x).reshape(-1, 1, 28, 28)
    y = torch.from_numpy(load_idx(f"{args.data}/t10k-labels-idx1-ubyte.gz")[: args.limit].astype(np.int64))
    with torch.no_grad():
        clean = (model(x).argmax(1) == y).float().mean().item()
    attack = torchattacks.AutoAttack(model, norm="Linf", eps=args.eps, version="standard", n_classes=10, seed=args.seed)
    start = time.perf_counter()
    adv = attack(x, y)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        robust = (model(adv).argmax(1) == y).float().mean().item()
    linf = (adv - x).abs().amax().item()
    print(json.dumps({
        "reference": "torchattacks AutoAttack(version='standard')", "torchattacks": torchattacks.__version__,
        "torch": torch.__version__, "threads": args.threads, "eps": args.eps, "images": len(y),
        "clean_accuracy": round(clean, 4), "robust_accuracy": round(robust, 4), "seconds": round(seconds, 2),
        "max_linf": linf,
    }))


if __name__ == "__main__":
    main()
