"""One PGD-7 adversarial-training step in PyTorch: the reference side of `cargo bench --bench adv_train`.

The same computation as Armoury's `ProjectedAdversarialDefense::madry` with `Pgd { steps: 7, step_size: 2/255,
keep_success: false, ..Pgd::linf(8/255) }` and SGD (lr 0.1, momentum 0.9, weight decay 5e-4), Rice et al.'s CIFAR
settings: 7 steps of L-inf PGD (sign of the input gradient of the summed cross-entropy, a step of alpha, back into
the eps-ball and [0, 1]) against the model in evaluation mode (Armoury attacks the model as deployed), then one SGD
step on the mean cross-entropy of the all-adversarial batch in training mode (BatchNorm on batch statistics,
running statistics updated with momentum 0.1 and the unbiased variance). The models are
`benches/support/resnets.rs`'s, with the same parameter names: PreAct-ResNet-18 (Rice et al.'s `preactresnet.py`)
and ResNet-18 (CIFAR stem), blocks [2, 2, 2, 2], widths 64-512, 32x32 RGB, 10 classes.

    cargo bench --bench adv_train -- --export /tmp/adv            # weights, batch and Armoury's check values
    python benches/reference/adv_train_step.py check /tmp/adv     # same computation? (no random start)
    python benches/reference/adv_train_step.py time /tmp/adv --threads 2 --steps 3
    python benches/reference/adv_train_step.py profile /tmp/adv preact_resnet18 --threads 2

`check` runs the attack without the random start from the exported weights and batch and compares with Armoury's
`<model>_check.safetensors`: the adversarial batch (pixels equal to 1e-6; a pixel whose input-gradient sign flips
between the two libraries moves by 2 alpha), the training loss on Armoury's adversarial batch (the step alone) and on
PyTorch's own, and the evaluation-mode logits after the update. `time` prints the median over `--steps` steps (after
one warm-up) of the whole step and of its two parts timed apart, as the Rust side does, then a JSON line.
`profile` prints torch.profiler's per-operator table of one step.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

EPS, ALPHA, STEPS = 8 / 255, 2 / 255, 7
MODELS = ["preact_resnet18", "resnet18"]
WIDTHS = (64, 128, 256, 512)


def seq(*named):
    m = nn.Sequential()
    for name, child in named:
        m.add_module(name, child)
    return m


class PreActBlock(nn.Module):
    """Rice et al.'s PreActBlock, with Armoury's names: pre (bn1, relu), body (conv1, bn2, relu, conv2), shortcut."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.pre = seq(("bn1", nn.BatchNorm2d(cin)), ("relu", nn.ReLU()))
        self.body = seq(
            ("conv1", nn.Conv2d(cin, cout, 3, stride, 1, bias=False)),
            ("bn2", nn.BatchNorm2d(cout)),
            ("relu", nn.ReLU()),
            ("conv2", nn.Conv2d(cout, cout, 3, 1, 1, bias=False)),
        )
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False))

    def forward(self, x):
        out = self.pre(x)
        shortcut = self.shortcut(out) if hasattr(self, "shortcut") else x
        return self.body(out) + shortcut


class PreActResNet18(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        cin = 64
        for i, w in enumerate(WIDTHS):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", nn.Sequential(PreActBlock(cin, w, stride), PreActBlock(w, w, 1)))
            cin = w
        self.bn = nn.BatchNorm2d(512)
        self.linear = nn.Linear(512, 10)

    def forward(self, x):
        out = self.layer4(self.layer3(self.layer2(self.layer1(self.conv1(x)))))
        out = F.avg_pool2d(F.relu(self.bn(out)), 4)
        return self.linear(out.flatten(1))


class Basic(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = seq(
            ("conv1", nn.Conv2d(cin, cout, 3, stride, 1, bias=False)),
            ("bn1", nn.BatchNorm2d(cout)),
            ("relu", nn.ReLU()),
            ("conv2", nn.Conv2d(cout, cout, 3, 1, 1, bias=False)),
            ("bn2", nn.BatchNorm2d(cout)),
        )
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return F.relu(self.body(x) + (self.shortcut(x) if hasattr(self, "shortcut") else x))


class ResNet18(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        cin = 64
        for i, w in enumerate(WIDTHS):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", nn.Sequential(Basic(cin, w, stride), Basic(w, w, 1)))
            cin = w
        self.linear = nn.Linear(512, 10)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.linear(F.avg_pool2d(out, 4).flatten(1))


def load(directory, name):
    model = {"preact_resnet18": PreActResNet18, "resnet18": ResNet18}[name]()
    state = load_file(os.path.join(directory, f"{name}.safetensors"))
    model.load_state_dict(state, strict=True)
    batch = load_file(os.path.join(directory, f"{name}_batch.safetensors"))
    return model, batch["x"], batch["labels"].long()


def pgd(model, x, y, random_start, generator=None):
    """Armoury's PGD-L-inf: adv += alpha*sign(grad of the summed cross-entropy), into the eps-ball and [0, 1]."""
    model.eval()
    lo, hi = (x - EPS).clamp(0, 1), (x + EPS).clamp(0, 1)
    adv = x.clone()
    if random_start:
        adv = (adv + torch.empty_like(x).uniform_(-EPS, EPS, generator=generator)).clamp(0, 1)
    for _ in range(STEPS):
        adv.requires_grad_(True)
        loss = F.cross_entropy(model(adv), y, reduction="sum")
        (g,) = torch.autograd.grad(loss, adv)
        adv = torch.min(torch.max(adv.detach() + ALPHA * g.sign(), lo), hi)
    return adv.detach()


def train_step(model, opt, x_adv, y):
    model.train()
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x_adv), y)
    loss.backward()
    opt.step()
    return loss.item()


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)


def check(directory, models):
    ok = True
    for name in models:
        want = load_file(os.path.join(directory, f"{name}_check.safetensors"))
        model, x, y = load(directory, name)
        x_adv = pgd(model, x, y, random_start=False)
        diff = (x_adv - want["x_adv"]).abs()
        differing = (diff > 1e-6).float().mean().item()
        # PGD's sign steps flip wherever a gradient entry near zero changes sign, so pixels differ between any two
        # float implementations: PyTorch's own two CPU convolutions (oneDNN's and its native one) are the measure.
        torch.backends.mkldnn.enabled = False
        native = pgd(model, x, y, random_start=False)
        torch.backends.mkldnn.enabled = True
        spread = ((native - x_adv).abs() > 1e-6).float().mean().item()
        # The training step on Armoury's adversarial batch (the step alone), then on PyTorch's own.
        state = {k: v.clone() for k, v in model.state_dict().items()}
        loss_theirs = train_step(model, sgd(model), want["x_adv"], y)
        model.eval()
        with torch.no_grad():
            logits = model(x)
        model.load_state_dict(state)
        loss_ours = train_step(model, sgd(model), x_adv, y)
        loss_rust = want["loss"].item()
        ref = want["logits_after"]
        logit_err = ((logits - ref).abs().max() / ref.abs().max()).item()
        passed = differing < max(1e-2, 2 * spread) and abs(loss_theirs - loss_rust) <= 1e-4 * max(1.0, abs(loss_rust)) and logit_err < 1e-3
        ok &= passed
        print(
            f"{name}: x_adv pixels differing {100 * differing:.4f}% (max {diff.max().item():.2e}; PyTorch's oneDNN "
            f"and native convolutions differ in {100 * spread:.4f}%); training loss "
            f"Armoury {loss_rust:.6f}, PyTorch on Armoury's batch {loss_theirs:.6f}, on its own {loss_ours:.6f}; "
            f"logits after the step, max relative difference {logit_err:.2e} -> {'ok' if passed else 'DIFFERENT'}"
        )
    return 0 if ok else 1


def timed(models, directory, steps):
    rows = []
    for name in models:
        model, x, y = load(directory, name)
        opt = sgd(model)
        gen = torch.Generator().manual_seed(0)
        whole, attack, train = [], [], []
        for s in range(steps + 1):
            t = time.perf_counter()
            train_step(model, opt, pgd(model, x, y, True, gen), y)
            ms = (time.perf_counter() - t) * 1e3
            t = time.perf_counter()
            x_adv = pgd(model, x, y, True, gen)
            a = (time.perf_counter() - t) * 1e3
            t = time.perf_counter()
            train_step(model, opt, x_adv, y)
            tr = (time.perf_counter() - t) * 1e3
            if s > 0:
                whole.append(ms), attack.append(a), train.append(tr)
        row = {"model": name, "batch": x.shape[0], "step_ms": statistics.median(whole),
               "attack_ms": statistics.median(attack), "train_ms": statistics.median(train)}
        print(f"{name:<16} {row['batch']:>5} {row['step_ms']:>10.1f} {row['attack_ms']:>10.1f} {row['train_ms']:>10.1f}")
        rows.append(row)
    return rows


def profile(directory, name):
    from torch.profiler import ProfilerActivity, profile as prof

    model, x, y = load(directory, name)
    opt = sgd(model)
    train_step(model, opt, pgd(model, x, y, True), y)  # warm-up
    with prof(activities=[ProfilerActivity.CPU]) as p:
        train_step(model, opt, pgd(model, x, y, True), y)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["check", "time", "profile"])
    ap.add_argument("dir")
    ap.add_argument("models", nargs="*", default=MODELS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.mode == "check":
        torch.set_num_threads(a.threads)
        sys.exit(check(a.dir, a.models))
    if a.mode == "profile":
        profile(a.dir, a.models[0])
        return
    load_avg = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load_avg}")
    print(f"{'model':<16} {'batch':>5} {'step ms':>10} {'attack ms':>10} {'train ms':>10}")
    rows = timed(a.models, a.dir, a.steps)
    print(json.dumps({"adv_train_pytorch": rows, "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
