"""Croce & Hein's own AutoAttack (PyPI `pyautoattack` 0.2.0, imported as `pyautoattack`) on Armoury's PGD-trained
Fashion-MNIST cnn: the strength and speed reference for `evaluate`'s cascade, at AutoAttack's standard budget.

`AutoAttack(model, norm=..., eps=..., version="standard", device="cpu", seed=...)` runs APGD-CE (100 iterations,
1 restart), APGD-T (100 iterations, 9 target classes), FAB-T (100 iterations, 9 target classes) and Square
(5,000 queries), each on the images the earlier ones left robust. The model is the reference `cnn`
(src/nn/models.rs) with PyTorch's child names, so Armoury's safetensors loads strictly; the images are the first N
test images of the Fashion-MNIST sample embedded in the repository (the first 1,000 of the full test set), pixel/255.

Set-up (once; see README.md beside this file):

    python3 -m venv /work/venv-aa
    /work/venv-aa/bin/pip install torch numpy safetensors pyautoattack==0.2.0

Run (from anywhere; paths default relative to this file):

    /work/venv-aa/bin/python benches/reference/autoattack_strength.py --norm Linf --eps 0.1 --n 1000 --out aa-linf.json
    /work/venv-aa/bin/python benches/reference/autoattack_strength.py --norm L2 --eps 1.5 --n 1000 --out aa-l2.json

Writes one JSON object (also printed): clean and robust accuracy, robust accuracy after each attack (from the
library's log), wall-clock seconds of `run_standard_evaluation`, versions and threads. Progress goes to stderr.
Before attacking it checks the PyTorch model against the golden logits of tests/fixtures/reference.safetensors
(the plain `cnn.safetensors` weights on the first 16 test images) and stops if they differ by more than 1e-4.
"""
import argparse
import collections
import gzip
import json
import logging
import os
import platform
import re
import sys
import time

import numpy as np
import torch
import torch.nn as nn
from safetensors.torch import load_file

import pyautoattack
from pyautoattack import AutoAttack

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def cnn():
    """The reference cnn of src/nn/models.rs, child names as Armoury's (and PyTorch's) parameter names.

    Same layers as `pytorch_epochs.cnn()`: Conv2d(1,16,5) → ReLU → MaxPool2d(2) → Conv2d(16,32,5) → ReLU →
    MaxPool2d(2) → Flatten → Linear(512,128) → ReLU → Linear(128,10); no padding, stride 1.
    """
    return nn.Sequential(collections.OrderedDict([
        ("conv1", nn.Conv2d(1, 16, 5)), ("conv1_relu", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(16, 32, 5)), ("conv2_relu", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(512, 128)), ("fc1_relu", nn.ReLU()),
        ("fc2", nn.Linear(128, 10)),
    ]))


def load_model(path):
    model = cnn()
    model.load_state_dict(load_file(path), strict=True)
    return model.eval()


def load_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_data(directory, n):
    images = load_idx(os.path.join(directory, "t10k-images-idx3-ubyte.gz"))
    labels = load_idx(os.path.join(directory, "t10k-labels-idx1-ubyte.gz"))
    if n > len(labels):
        raise SystemExit(f"--n {n} but {directory} holds only {len(labels)} test images")
    x = torch.from_numpy(images[:n].astype(np.float32) / 255.0).reshape(n, 1, 28, 28)
    y = torch.from_numpy(labels[:n].astype(np.int64))
    return x, y


def golden_check(fixtures, data_x):
    """Max |logit difference| of the plain cnn against the fixture's golden logits, and whether the fixture's
    images are the data's first 16."""
    weights = os.path.join(fixtures, "cnn.safetensors")
    ref_path = os.path.join(fixtures, "reference.safetensors")
    if not (os.path.exists(weights) and os.path.exists(ref_path)):
        return None
    ref = load_file(ref_path)
    with torch.no_grad():
        logits = load_model(weights)(ref["x"])
    k = min(len(ref["x"]), len(data_x))
    return {
        "fixture": "tests/fixtures/reference.safetensors cnn.logits (cnn.safetensors)",
        "max_abs_logit_diff": float((logits - ref["cnn.logits"]).abs().max()),
        "images_match_data": bool(torch.equal(ref["x"][:k], data_x[:k])),
    }


class Capture(logging.Handler):
    """Keeps AutoAttack's log lines; 'robust accuracy after APGD-CE: 70.00% (total time 12.3 s)' gives the
    per-attack figures (two decimals of a percentage: exact for N ≤ 10,000)."""

    AFTER = re.compile(r"robust accuracy after (\S+): ([0-9.]+)% \(total time ([0-9.]+) s\)")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []
        self.warned = []

    def emit(self, record):
        self.lines.append(record.getMessage())
        if record.levelno >= logging.WARNING:
            self.warned.append(record.getMessage())

    def per_attack(self):
        out = collections.OrderedDict()
        for line in self.lines:
            m = self.AFTER.search(line)
            if m:
                out[m.group(1).lower()] = {"robust_accuracy": round(float(m.group(2)) / 100, 6),
                                           "cumulative_seconds": float(m.group(3))}
        return out

    def warnings(self):
        """The library's checks (randomness, output range, Square's success after the others…) warn here."""
        return list(self.warned)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--norm", choices=["Linf", "L2"], required=True)
    ap.add_argument("--eps", type=float, required=True)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bs", type=int, default=500, help="run_standard_evaluation batch_size")
    ap.add_argument("--out", required=True)
    ap.add_argument("--weights", default=os.path.join(ROOT, "tests", "fixtures", "cnn-pgd.safetensors"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "fashion-mnist-sample"))
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x, y = load_data(args.data, args.n)
    golden = golden_check(os.path.join(ROOT, "tests", "fixtures"), x)
    if golden is not None and (golden["max_abs_logit_diff"] > 1e-4 or not golden["images_match_data"]):
        raise SystemExit(f"model/data check against the fixture failed: {golden}")
    model = load_model(args.weights)
    with torch.no_grad():
        clean = (model(x).argmax(1) == y).float().mean().item()

    logger = logging.getLogger("auto-attack")
    logger.setLevel(logging.DEBUG)
    capture = Capture()
    logger.addHandler(capture)
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger.addHandler(stderr)
    logger.propagate = False

    attack = AutoAttack(model, norm=args.norm, eps=args.eps, version="standard", device="cpu", seed=args.seed)
    start = time.perf_counter()
    x_adv, _ = attack.run_standard_evaluation(x, y, batch_size=args.bs)
    seconds = time.perf_counter() - start

    with torch.no_grad():
        robust = (model(x_adv).argmax(1) == y).float().mean().item()
    d = (x_adv - x).reshape(len(x), -1)
    max_pert = float(d.abs().max(1)[0].max() if args.norm == "Linf" else d.norm(dim=1).max())
    result = {
        "reference": "pyautoattack AutoAttack(version='standard') run_standard_evaluation",
        "model": os.path.relpath(args.weights, ROOT),
        "data": os.path.relpath(args.data, ROOT),
        "norm": args.norm, "eps": args.eps, "n": args.n, "seed": args.seed, "batch_size": args.bs,
        "clean_accuracy": round(clean, 6),
        "robust_accuracy": round(robust, 6),
        "per_attack": capture.per_attack(),
        "seconds": round(seconds, 2),
        "max_perturbation": max_pert,
        "in_range": bool(x_adv.min() >= 0 and x_adv.max() <= 1),
        "library_warnings": capture.warnings(),
        "golden_check": golden,
        "versions": {"pyautoattack": pyautoattack.__version__, "torch": torch.__version__,
                     "numpy": np.__version__, "python": platform.python_version()},
        "torch_threads": torch.get_num_threads(),
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
    }
    text = json.dumps(result, indent=2)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
