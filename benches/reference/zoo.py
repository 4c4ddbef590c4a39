"""The benchmark zoo in PyTorch and onnxruntime, on the weights Armoury exports.

    cargo bench --bench core -- --export /tmp/zoo      # weights + a check batch per model
    python3 benches/reference/zoo.py /tmp/zoo [MODEL ...] [--batches 1,128,1000] [--budget-ms 1500]

The models are defined here as in benches/support/bench.rs (same layers, same parameter names), loaded from
`<model>.safetensors`, checked against Armoury's logits and input gradient in `<model>_check.safetensors`, then
timed: forward and forward + input gradient (eval mode, summed cross-entropy) and an Adam training step (train
mode) in PyTorch, and forward in onnxruntime on an ONNX export (`torch.onnx.export`, dynamic batch). Each time
is the median of as many runs as fit in the budget (at least 3) after one warm-up, the same protocol as the Rust
bench, and the output table has the same columns. Run it interleaved with the Rust bench on one machine.
"""

import json
import os
import statistics
import sys
import time
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.numpy import load_file


def seq(children):
    """An `nn.Sequential` with named children (in insertion order), as Armoury's `Sequential`."""
    return nn.Sequential(OrderedDict(children))


def conv3(cin, cout, stride=1, bias=True):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=bias)


def cnn():
    return seq(
        {
            "conv1": nn.Conv2d(1, 16, 5),
            "conv1_relu": nn.ReLU(),
            "pool1": nn.MaxPool2d(2),
            "conv2": nn.Conv2d(16, 32, 5),
            "conv2_relu": nn.ReLU(),
            "pool2": nn.MaxPool2d(2),
            "flatten": nn.Flatten(),
            "fc1": nn.Linear(512, 128),
            "fc1_relu": nn.ReLU(),
            "fc2": nn.Linear(128, 10),
        }
    )


def mlp():
    return seq(
        {
            "flatten": nn.Flatten(),
            "fc1": nn.Linear(784, 256),
            "fc1_relu": nn.ReLU(),
            "fc2": nn.Linear(256, 256),
            "fc2_relu": nn.ReLU(),
            "fc3": nn.Linear(256, 10),
        }
    )


def vgg():
    return seq(
        {
            "conv1": conv3(3, 16),
            "conv1_relu": nn.ReLU(),
            "conv2": conv3(16, 16),
            "conv2_relu": nn.ReLU(),
            "pool1": nn.MaxPool2d(2),
            "conv3": conv3(16, 32),
            "conv3_relu": nn.ReLU(),
            "conv4": conv3(32, 32),
            "conv4_relu": nn.ReLU(),
            "pool2": nn.MaxPool2d(2),
            "conv5": conv3(32, 64),
            "conv5_relu": nn.ReLU(),
            "pool3": nn.MaxPool2d(2),
            "flatten": nn.Flatten(),
            "fc1": nn.Linear(1024, 128),
            "fc1_relu": nn.ReLU(),
            "fc2": nn.Linear(128, 10),
        }
    )


class Residual(nn.Module):
    """body(x) + shortcut(x), the identity without a shortcut (as `Residual` in benches/support/bench.rs)."""

    def __init__(self, body, shortcut=None):
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x):
        return self.body(x) + (x if self.shortcut is None else self.shortcut(x))


def basic_body(cin, cout, stride):
    return seq(
        {
            "conv1": conv3(cin, cout, stride, bias=False),
            "bn1": nn.BatchNorm2d(cout),
            "relu": nn.ReLU(),
            "conv2": conv3(cout, cout, bias=False),
            "bn2": nn.BatchNorm2d(cout),
        }
    )


def resnet():
    shortcut = seq({"conv": nn.Conv2d(16, 32, 1, stride=2, bias=False), "bn": nn.BatchNorm2d(32)})
    return seq(
        {
            "stem": conv3(3, 16, bias=False),
            "stem_bn": nn.BatchNorm2d(16),
            "stem_relu": nn.ReLU(),
            "block1": Residual(basic_body(16, 16, 1)),
            "block1_relu": nn.ReLU(),
            "block2": Residual(basic_body(16, 32, 2), shortcut),
            "block2_relu": nn.ReLU(),
            "pool": nn.AvgPool2d(16),
            "flatten": nn.Flatten(),
            "fc": nn.Linear(32, 10),
        }
    )


def wide_mlp():
    return seq(
        {
            "flatten": nn.Flatten(),
            "fc1": nn.Linear(3072, 1024),
            "fc1_relu": nn.ReLU(),
            "fc2": nn.Linear(1024, 1024),
            "fc2_relu": nn.ReLU(),
            "fc3": nn.Linear(1024, 10),
        }
    )


MODELS = {"cnn": cnn, "mlp": mlp, "vgg": vgg, "resnet": resnet, "wide_mlp": wide_mlp}

# Multiply-adds per image, as `Zoo::macs_per_image` counts them (convolutions and Linear layers only).
MACS = {"cnn": 1_116_416, "mlp": 268_800, "vgg": 7_652_608, "resnet": 8_831_296, "wide_mlp": 4_204_544}

SHAPES = {"cnn": (1, 28, 28), "mlp": (1, 28, 28)}


def load(name, directory):
    model = MODELS[name]()
    state = load_file(os.path.join(directory, f"{name}.safetensors"))
    own = model.state_dict()
    missing = set(own) ^ set(state)
    if missing:
        raise SystemExit(f"{name}: parameter names differ from Armoury's: {sorted(missing)}")
    model.load_state_dict({k: torch.from_numpy(v).to(own[k].dtype) for k, v in state.items()})
    return model.eval()


def check(name, model, directory):
    """The largest absolute differences from Armoury's logits and input gradient on its 8 check inputs."""
    ref = load_file(os.path.join(directory, f"{name}_check.safetensors"))
    x = torch.from_numpy(ref["x"]).requires_grad_(True)
    labels = torch.from_numpy(ref["labels"]).long()
    logits = model(x)
    F.cross_entropy(logits, labels, reduction="sum").backward()
    dl = np.abs(logits.detach().numpy() - ref["logits"]).max()
    dg = np.abs(x.grad.numpy() - ref["input_grad"]).max()
    return float(dl), float(dg)


def median_ms(budget_ms, fn):
    t = time.perf_counter()
    fn()
    once = (time.perf_counter() - t) * 1e3
    reps = int(min(max(budget_ms / max(once, 1e-3), 3), 201))
    times = []
    for _ in range(reps - 1):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def inputs(name, n):
    shape = SHAPES.get(name, (3, 32, 32))
    gen = torch.Generator().manual_seed(n)
    x = torch.rand((n, *shape), generator=gen)
    return x, torch.arange(n) % 10


def rows_for(name, model, batches, budget_ms, directory):
    out = []

    def add(workload, batch, ms, factor, engine):
        gflops = factor * 2 * MACS[name] * batch / (ms / 1e3) / 1e9
        out.append({"engine": engine, "model": name, "workload": workload, "batch": batch, "ms": ms, "gflops": gflops})

    for b in batches:
        x, y = inputs(name, b)
        with torch.no_grad():
            add("forward", b, median_ms(budget_ms, lambda: model(x)), 1, "pytorch")

        def grad():
            xg = x.clone().requires_grad_(True)
            F.cross_entropy(model(xg), y, reduction="sum").backward(inputs=[xg])
            return xg.grad

        add("forward_input_grad", b, median_ms(budget_ms, grad), 2, "pytorch")
    train = MODELS[name]()
    train.load_state_dict(model.state_dict())
    train.train()
    opt = torch.optim.Adam(train.parameters())
    for b in batches:
        x, y = inputs(name, b)

        def step():
            opt.zero_grad()
            F.cross_entropy(train(x), y).backward()
            opt.step()

        add("train_step", b, median_ms(budget_ms, step), 3, "pytorch")
    try:
        import onnxruntime as ort
    except ImportError:
        return out
    path = os.path.join(directory, f"{name}.onnx")
    torch.onnx.export(
        model,
        (torch.zeros(1, *SHAPES.get(name, (3, 32, 32))),),
        path,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
        dynamo=False,
    )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    for b in batches:
        x = inputs(name, b)[0].numpy()
        add("forward", b, median_ms(budget_ms, lambda: sess.run(None, {"x": x})), 1, "onnxruntime")
    return out


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    directory, names, batches, budget = args[0], [], [1, 128, 1000], 1500.0
    rest = iter(args[1:])
    for a in rest:
        if a == "--batches":
            batches = [int(v) for v in next(rest).split(",")]
        elif a == "--budget-ms":
            budget = float(next(rest))
        else:
            names.append(a)
    names = names or list(MODELS)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()}")
    rows = []
    for name in names:
        model = load(name, directory)
        dl, dg = check(name, model, directory)
        print(f"{name}: max |logits - Armoury's| {dl:.2e}, max |input grad - Armoury's| {dg:.2e}")
        if dl > 1e-3 or dg > 1e-3:
            raise SystemExit(f"{name}: not the same function as Armoury's model")
        rows.extend(rows_for(name, model, batches, budget, directory))
    print(f"{'engine':<12} {'model':<9} {'workload':<20} {'batch':>6} {'ms':>11} {'GFLOP/s':>9}")
    for r in rows:
        print(
            f"{r['engine']:<12} {r['model']:<9} {r['workload']:<20} {r['batch']:>6} {r['ms']:>11.3f} {r['gflops']:>9.1f}"
        )
    print(json.dumps({"zoo": rows}))


if __name__ == "__main__":
    main()
