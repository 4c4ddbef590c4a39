"""The full-size model zoo for the benchmark (issue 32): ONNX exports and the peers' timings.

    python benches/reference/zoo_full.py export DIR [MODEL ...] [--exporter ts17|ts13|dynamo18]
    python benches/reference/zoo_full.py time DIR [MODEL ...] [--threads 2] [--rounds 7]

The architectures and their seeded random weights are those of tests/fixtures/scripts/zoo_models.py at
torchvision's default configurations (`full_model` there): ImageNet models at 224×224, batch 4; the CIFAR models
(PreAct-ResNet-18, WRN-28-10) at 32×32, batch 32. Nothing here is committed: the files are 5–500 MB each.

`export` writes `<model>.onnx` (dynamic batch axis, input `input`, output `logits`, exporter metadata removed;
the TorchScript exporter at opset 17 unless --exporter says otherwise) and `<model>_input.safetensors` (`x` in
[0, 1], seeded, and labels `y`) for every model (default: all).

`time` measures on those files, with `--threads` intra-op threads for both peers (default 2):
onnxruntime's forward (CPU provider, default graph optimisations), PyTorch's forward (eval mode, no_grad), and
PyTorch's forward + input gradient (`torch.autograd.grad` of the summed cross-entropy with respect to the input
only, no parameter gradients). Each round runs the three once each in turn (interleaved, after one warm-up of
each); the table gives the median over `--rounds` rounds in ms per call. Run it when the machine is quiet.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file, save_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "scripts"))
import zoo_models  # noqa: E402

EXPORTERS = {tag: (exporter, opset) for tag, exporter, opset in zoo_models.EXPORTS}


def inputs(name):
    _, hw, batch = zoo_models.ARCHS[name][2:5]
    gen = torch.Generator().manual_seed(0)
    x = torch.rand((batch, 3, hw, hw), generator=gen)
    y = torch.randint(0, 1000 if hw == 224 else 10, (batch,), generator=gen)
    return x, y


def export(directory, names, tag):
    exporter, opset = EXPORTERS[tag]
    os.makedirs(directory, exist_ok=True)
    for name in names:
        model, _, _ = zoo_models.full_model(name)
        x, y = inputs(name)
        path = os.path.join(directory, f"{name}.onnx")
        t = time.perf_counter()
        zoo_models.export(model, x, exporter, opset, path)
        save_file({"x": x.numpy(), "y": y.numpy().astype(np.int64)}, os.path.join(directory, f"{name}_input.safetensors"))
        print(f"{name}: {path} ({os.path.getsize(path) / 1e6:.1f} MB, {tag}, {time.perf_counter() - t:.0f} s)")


def timings(directory, names, threads, rounds):
    torch.set_num_threads(threads)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    rows = []
    for name in names:
        model, hw, batch = zoo_models.full_model(name)
        data = load_file(os.path.join(directory, f"{name}_input.safetensors"))
        x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
        session = onnxruntime.InferenceSession(
            os.path.join(directory, f"{name}.onnx"), options, providers=["CPUExecutionProvider"]
        )

        def ort_forward():
            return session.run(["logits"], {"input": data["x"]})[0]

        def torch_forward():
            with torch.no_grad():
                return model(x)

        def torch_grad():
            xg = x.clone().requires_grad_(True)
            return torch.autograd.grad(F.cross_entropy(model(xg), y, reduction="sum"), xg)[0]

        for p in model.parameters():
            p.requires_grad_(False)  # input gradient only
        diff = float(np.abs(ort_forward() - torch_forward().numpy()).max())
        runs = {"ort": ort_forward, "torch": torch_forward, "grad": torch_grad}
        times = {k: [] for k in runs}
        for fn in runs.values():
            fn()
        for _ in range(rounds):
            for k, fn in runs.items():
                t = time.perf_counter()
                fn()
                times[k].append((time.perf_counter() - t) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append((name, batch, hw, med["ort"], med["torch"], med["grad"], diff))
        print(f"{name}: done", file=sys.stderr)
    print(f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}, {threads} threads, median of {rounds} interleaved rounds (ms per call)")
    print("| model | batch × size | onnxruntime fwd | PyTorch fwd | PyTorch fwd + ∂x | max |ort − torch| |")
    print("|---|---|---|---|---|---|")
    for name, batch, hw, o, t, g, d in rows:
        print(f"| {name} | {batch} × {hw}² | {o:.1f} | {t:.1f} | {g:.1f} | {d:.1e} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["export", "time"])
    parser.add_argument("directory")
    parser.add_argument("models", nargs="*")
    parser.add_argument("--exporter", choices=sorted(EXPORTERS), default="ts17")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    names = args.models or list(zoo_models.ARCHS)
    unknown = [m for m in names if m not in zoo_models.ARCHS]
    if unknown:
        sys.exit(f"unknown models {unknown}; known: {list(zoo_models.ARCHS)}")
    if args.command == "export":
        export(args.directory, names, args.exporter)
    else:
        timings(args.directory, names, args.threads, args.rounds)


if __name__ == "__main__":
    main()
