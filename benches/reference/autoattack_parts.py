"""torchattacks' four AutoAttack attacks chained by hand, each timed: the per-attack reference of the table in
docs/evaluation.md ("Strength and speed against AutoAttack"). Each attack runs only on the images the earlier ones
left robust, as AutoAttack does, with torchattacks 3.5.1's settings of `AutoAttack(version="standard")` except
`steps` (10 there, torchattacks' default; AutoAttack's own protocol uses 100).

Needs `pip install torch torchattacks==3.5.1 safetensors numpy`. From benches/reference/:

    python3 autoattack_parts.py --weights ../../tests/fixtures/cnn-pgd.safetensors --limit 1000 --steps 10
"""
import argparse
import time

import numpy as np
import torch
import torchattacks
from safetensors.torch import load_file

from pytorch_epochs import cnn, load_idx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--data", default="../../data/fashion-mnist-sample")
    ap.add_argument("--eps", type=float, default=0.1)
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = cnn()
    names = {"conv1": "0", "conv2": "3", "fc1": "7", "fc2": "9"}
    state = {names[k.split(".")[0]] + "." + k.split(".", 1)[1]: v for k, v in load_file(args.weights).items()}
    model.load_state_dict(state)
    model.eval()
    x = load_idx(f"{args.data}/t10k-images-idx3-ubyte.gz")[: args.limit].astype(np.float32) / 255.0
    x = torch.from_numpy(x).reshape(-1, 1, 28, 28)
    y = torch.from_numpy(load_idx(f"{args.data}/t10k-labels-idx1-ubyte.gz")[: args.limit].astype(np.int64))
    eps, steps = args.eps, args.steps
    attacks = [
        ("apgd-ce", torchattacks.APGD(model, eps=eps, norm="Linf", seed=0, loss="ce", n_restarts=1, steps=steps)),
        ("apgd-t", torchattacks.APGDT(model, eps=eps, norm="Linf", seed=0, n_classes=10, n_restarts=1, steps=steps)),
        ("fab-t", torchattacks.FAB(model, eps=eps, norm="Linf", seed=0, multi_targeted=True, n_classes=10,
                                   n_restarts=1, steps=steps)),
        ("square", torchattacks.Square(model, eps=eps, norm="Linf", seed=0, n_queries=5000, n_restarts=1)),
    ]
    with torch.no_grad():
        robust = model(x).argmax(1) == y
    print("clean", robust.float().mean().item())
    for name, attack in attacks:
        idx = robust.nonzero().flatten()
        start = time.perf_counter()
        adv = attack(x[idx], y[idx])
        seconds = time.perf_counter() - start
        with torch.no_grad():
            still = model(adv).argmax(1) == y[idx]
        robust[idx[~still]] = False
        print(name, "seconds", round(seconds, 2), "robust", robust.float().mean().item(), "attacked", len(idx))


if __name__ == "__main__":
    main()
