"""onnxruntime's own per-node profile of one zoo model, to set beside Armoury's `--profile` layer by layer.

    python benches/reference/ort_profile.py DIR MODEL [--threads 2] [--runs 6] [--rows 30]

DIR is what `zoo_full.py export` wrote. Runs MODEL's forward `--runs` times (after one warm-up run, left out) on its saved input with onnxruntime's
profiling on (CPU provider, default graph optimisations: the NCHWc layout on AVX-512 machines, whose channel
counts are padded to 16) and prints the milliseconds per run by operator, then by (operator, input shape, output
shape) with the number of nodes, most expensive first. Profiling adds overhead to every node, as `--profile` does
to Armoury's steps: compare shares and layers, not totals against `zoo_full.py compare`.
"""

import argparse
import collections
import json
import os
import tempfile

import onnxruntime as ort
from safetensors.numpy import load_file


def shape(entry):
    return list(entry.values())[0] if entry else []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--rows", type=int, default=30)
    a = ap.parse_args()
    x = load_file(os.path.join(a.dir, f"{a.model}_input.safetensors"))["x"]
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = a.threads, 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), a.model)
    session = ort.InferenceSession(os.path.join(a.dir, f"{a.model}.onnx"), so, providers=["CPUExecutionProvider"])
    for _ in range(a.runs + 1):
        session.run(None, {"input": x})
    events = json.load(open(session.end_profiling()))
    # The first run is the warm-up (allocations, first touches): its nodes are left out.
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    after = runs[0][1]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > after]
    by_op = collections.defaultdict(float)
    by_layer = collections.defaultdict(lambda: [0.0, 0])
    for e in nodes:
        args = e["args"]
        ms = e["dur"] / 1e3 / a.runs
        by_op[args["op_name"]] += ms
        ins, outs = args.get("input_type_shape", [{}]), args.get("output_type_shape", [{}])
        key = (args["op_name"], str(shape(ins[0] if ins else {})), str(shape(outs[0] if outs else {})))
        by_layer[key][0] += ms
        by_layer[key][1] += 1
    print(f"{a.model}: {sum(by_op.values()):.1f} ms of node time per run ({a.runs} runs, {a.threads} threads)")
    for op, ms in sorted(by_op.items(), key=lambda t: -t[1]):
        print(f"  {op:24s} {ms:8.2f}")
    print(f"  {'ms':>7s} {'nodes':>5s}  op                       input → output")
    for (op, i, o), (ms, n) in sorted(by_layer.items(), key=lambda t: -t[1][0])[: a.rows]:
        print(f"  {ms:7.2f} {n // a.runs:5d}  {op:24s} {i} → {o}")


if __name__ == "__main__":
    main()
