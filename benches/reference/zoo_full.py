"""The full-size model zoo for the benchmark (issue 32): ONNX exports and the peers' timings.

    python benches/reference/zoo_full.py export DIR [MODEL ...] [--exporter ts17|ts13|dynamo18]
    python benches/reference/zoo_full.py time DIR [MODEL ...] [--threads 2] [--rounds 7]
    python benches/reference/zoo_full.py compare DIR [MODEL ...] --armoury BIN [--threads 2] [--rounds 5]
    python benches/reference/zoo_full.py autoattack DIR MODEL [--n 32] [--threads 2] [--labels JSON]

The architectures and their seeded random weights are those of tests/fixtures/scripts/zoo_models.py at
torchvision's default configurations (`full_model` there): ImageNet models at 224×224, batch 4; the CIFAR models
(PreAct-ResNet-18, WRN-28-10) at 32×32, batch 32. Nothing here is committed: the files are 5–500 MB each.

`export` writes `<model>.onnx` (dynamic batch axis, input `input`, output `logits`, exporter metadata removed;
the TorchScript exporter at opset 17 unless --exporter says otherwise), `<model>_input.safetensors` (`x` in
[0, 1], seeded, labels `y` and PyTorch's `logits` on `x`) and `<model>.json` (batch, size and the forward's FLOPs as PyTorch's
`FlopCounterMode` counts them) for every model (default: all).

`time` measures on those files, with `--threads` intra-op threads for both peers (default 2):
onnxruntime's forward (CPU provider, default graph optimisations), PyTorch's forward (eval mode, no_grad), and
PyTorch's forward + input gradient (`torch.autograd.grad` of the summed cross-entropy with respect to the input
only, no parameter gradients). Each round runs the three once each in turn (interleaved, after one warm-up of
each); the table gives the median over `--rounds` rounds in ms per call. Run it when the machine is quiet.

`compare` is the side-by-side run of the performance issue: Armoury's bench binary (`cargo bench --bench zoo
--no-run` prints its path; pass it as --armoury) and the peers, interleaved round by round. Per model and round
it first runs `BIN DIR MODEL --json --reps 3 --peak P` (a fresh process: load, one warm-up, three timed calls of
each workload, RAYON_NUM_THREADS=--threads), then the three peer workloads three times each; the table gives the
medians over all rounds, the ratios (the peer's time over Armoury's: above 1, Armoury is faster), Armoury's
GFLOP/s and its share of the machine's peak (measured once, at the start, by the bench binary), and the load
average before and after. `--before BIN2` runs a second build of the bench binary (an older commit's) in the same
rounds, right after the first, and adds a before → after table.

`autoattack` runs the authors' AutoAttack (`pyautoattack`, standard version: APGD-CE, APGD-T, FAB-T, Square;
L∞, ε = 8/255, seed 0, CPU, one batch) on the model's first N images labelled with the model's own predictions
(so every image is attacked; `--labels` takes the `labels` of the JSON line `zoo --autoattack N` printed, so both
attack the same labels) and prints one JSON line: seconds of `run_standard_evaluation`, clean and robust
accuracy, the cumulative time after each attack from the library's log, and the samples passed forward and with
gradients (the bench binary counts the same; its APGD stops a sample at its first success, the authors' runs
every iteration, so the time per sample pass compares the passes and the totals compare the evaluations). The bench binary's `--autoattack N`
is Armoury's side of the same run.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode
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


def forward_flops(model, x):
    """FLOPs of one forward of the batch `x` as PyTorch counts them (`FlopCounterMode`: 2 per multiply-add of
    the convolutions, linear layers, matrix products and attention; element-wise ops not counted). With gradients
    enabled: without them `nn.MultiheadAttention` in evaluation mode takes its fused fast path, whose products the
    counter does not see (ViT-B/16 counted 90.2 GFLOP instead of 140.6 at batch 4)."""
    counter = FlopCounterMode(display=False)
    with counter, torch.enable_grad():
        model(x)
    return counter.get_total_flops()


def export(directory, names, tag):
    exporter, opset = EXPORTERS[tag]
    os.makedirs(directory, exist_ok=True)
    for name in names:
        model, _, _ = zoo_models.full_model(name)
        x, y = inputs(name)
        path = os.path.join(directory, f"{name}.onnx")
        t = time.perf_counter()
        zoo_models.export(model, x, exporter, opset, path)
        with torch.no_grad():
            logits = model(x).numpy()
        tensors = {"x": x.numpy(), "y": y.numpy().astype(np.int64), "logits": logits}
        save_file(tensors, os.path.join(directory, f"{name}_input.safetensors"))
        with open(os.path.join(directory, f"{name}.json"), "w") as f:
            json.dump({"model": name, "batch": len(x), "hw": x.shape[-1], "forward_flops": forward_flops(model, x)}, f)
        print(f"{name}: {path} ({os.path.getsize(path) / 1e6:.1f} MB, {tag}, {time.perf_counter() - t:.0f} s)")


def peers(directory, name, threads):
    """onnxruntime's forward, PyTorch's forward and PyTorch's forward + input gradient on the model's batch."""
    torch.set_num_threads(threads)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    model, _, _ = zoo_models.full_model(name)
    for p in model.parameters():
        p.requires_grad_(False)  # input gradient only
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

    return {"ort": ort_forward, "torch": torch_forward, "grad": torch_grad}


def timings(directory, names, threads, rounds):
    rows = []
    for name in names:
        _, hw, batch = zoo_models.ARCHS[name][2:5]
        runs = peers(directory, name, threads)
        ort_forward, torch_forward = runs["ort"], runs["torch"]
        diff = float(np.abs(ort_forward() - torch_forward().numpy()).max())
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


def autoattack(directory, name, n, threads, labels):
    import logging
    import re

    import pyautoattack
    from pyautoattack import AutoAttack

    torch.set_num_threads(threads)
    net, _, _ = zoo_models.full_model(name)
    for p in net.parameters():
        p.requires_grad_(False)
    passes = {"forward_samples": 0, "gradient_samples": 0}

    class Counted(torch.nn.Module):
        """The model, counting the samples passed forward, and those passed with gradients recorded."""

        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            passes["forward_samples"] += len(x)
            passes["gradient_samples"] += len(x) if torch.is_grad_enabled() and x.requires_grad else 0
            return self.net(x)

    model = Counted().eval()
    x = torch.from_numpy(load_file(os.path.join(directory, f"{name}_input.safetensors"))["x"][:n])
    with torch.no_grad():
        predicted = model(x).argmax(1)
    y = torch.tensor(json.loads(labels)["labels"]) if labels else predicted
    log = []

    class Capture(logging.Handler):
        def emit(self, record):
            log.append(record.getMessage())

    logger = logging.getLogger("auto-attack")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(Capture())
    logger.propagate = False
    attack = AutoAttack(model, norm="Linf", eps=8 / 255, version="standard", device="cpu", seed=0)
    passes.update(forward_samples=0, gradient_samples=0)
    t = time.perf_counter()
    x_adv, _ = attack.run_standard_evaluation(x, y, batch_size=len(x))
    seconds = time.perf_counter() - t
    with torch.no_grad():
        robust = (model(x_adv).argmax(1) == y).float().mean().item()
    after = [m for m in log if re.search(r"robust accuracy after|total time", m)]
    print(json.dumps({
        "model": name, "n": len(x), "eps": 8 / 255, "seconds": seconds,
        "clean_accuracy": (predicted == y).float().mean().item(), "robust_accuracy": robust,
        "per_attack": after, "threads": threads, **passes,
        "versions": {"pyautoattack": pyautoattack.__version__, "torch": torch.__version__},
    }))


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def compare(directory, names, armoury, threads, rounds, before=None):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    peak = subprocess.run([armoury, "--peak-only"], env=env, capture_output=True, text=True, check=True)
    peak = float(peak.stdout.strip())
    load_before = loadavg()
    rows = []
    for name in names:
        runs = peers(directory, name, threads)
        for fn in runs.values():
            fn()
        times = {k: [] for k in ["armoury_fwd", "armoury_grad", "before_fwd", "before_grad", *runs]}
        meta = None
        for _ in range(rounds):
            for tag, binary in [("armoury", armoury), ("before", before)]:
                if binary is None:
                    continue
                out = subprocess.run(
                    [binary, directory, name, "--json", "--reps", "3", "--peak", str(peak)],
                    env=env, capture_output=True, text=True,
                )
                if out.returncode != 0:
                    sys.exit(f"{name}: {binary} failed:\n{out.stderr}")
                m = json.loads(out.stdout.strip().splitlines()[-1])
                meta = m if tag == "armoury" else meta
                times[f"{tag}_fwd"].append(m["forward_ms"])
                times[f"{tag}_grad"].append(m["grad_ms"])
            for _ in range(3):
                for k, fn in runs.items():
                    t = time.perf_counter()
                    fn()
                    times[k].append((time.perf_counter() - t) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items() if v}
        rows.append((name, meta, med))
        print(f"{name}: done", file=sys.stderr)
    load_after = loadavg()
    print(
        f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}, {threads} threads each, "
        f"measured peak {peak:.0f} GFLOP/s, load average {load_before} before and {load_after} after; "
        f"medians of {rounds} interleaved rounds (ms per call)"
    )
    print(
        "| model | batch × size | GFLOP | Armoury fwd | onnxruntime fwd | ratio | Armoury fwd + ∂x | PyTorch fwd + ∂x "
        "| ratio | Armoury GFLOP/s fwd / fwd + ∂x (% peak) | PyTorch fwd | max |Δ logits| |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for name, m, t in rows:
        gf = m["forward_flops"] / 1e9
        rf, rg = gf / (t["armoury_fwd"] / 1e3), 2 * gf / (t["armoury_grad"] / 1e3)
        print(
            f"| {name} | {m['batch']} × {m['hw']}² | {gf:.1f} | {t['armoury_fwd']:.1f} | {t['ort']:.1f} "
            f"| {t['ort'] / t['armoury_fwd']:.2f} | {t['armoury_grad']:.1f} | {t['grad']:.1f} "
            f"| {t['grad'] / t['armoury_grad']:.2f} | {rf:.0f} / {rg:.0f} ({100 * rf / peak:.0f}% / {100 * rg / peak:.0f}%) "
            f"| {t['torch']:.1f} | {m['max_logit_diff']:.1e} |"
        )
    if before:
        print(f"\nArmoury before ({before}) → after, the same rounds (ms per call)")
        print("| model | fwd before | fwd after | × | fwd + ∂x before | fwd + ∂x after | × |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, m, t in rows:
            print(
                f"| {name} | {t['before_fwd']:.1f} | {t['armoury_fwd']:.1f} | {t['before_fwd'] / t['armoury_fwd']:.2f} "
                f"| {t['before_grad']:.1f} | {t['armoury_grad']:.1f} | {t['before_grad'] / t['armoury_grad']:.2f} |"
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["export", "time", "compare", "autoattack"])
    parser.add_argument("--n", type=int, default=32, help="autoattack: images")
    parser.add_argument("--labels", help="autoattack: a JSON line of `zoo --autoattack` (its labels are used)")
    parser.add_argument("directory")
    parser.add_argument("models", nargs="*")
    parser.add_argument("--exporter", choices=sorted(EXPORTERS), default="ts17")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--armoury", help="Armoury's bench binary (cargo bench --bench zoo --no-run prints it)")
    parser.add_argument("--before", help="compare: a second bench binary (an older build), run in the same rounds")
    args = parser.parse_args()
    names = args.models or list(zoo_models.ARCHS)
    unknown = [m for m in names if m not in zoo_models.ARCHS]
    if unknown:
        sys.exit(f"unknown models {unknown}; known: {list(zoo_models.ARCHS)}")
    if args.command == "export":
        export(args.directory, names, args.exporter)
    elif args.command == "autoattack":
        for name in names:
            autoattack(args.directory, name, args.n, args.threads, args.labels)
    elif args.command == "time":
        timings(args.directory, names, args.threads, args.rounds or 7)
    else:
        if not args.armoury:
            sys.exit("compare needs --armoury BIN (cargo bench --bench zoo --no-run prints the path)")
        if not args.models:
            names = sorted(f[: -len(".onnx")] for f in os.listdir(args.directory) if f.endswith(".onnx"))
        compare(args.directory, names, args.armoury, args.threads, args.rounds or 5, args.before)


if __name__ == "__main__":
    main()
