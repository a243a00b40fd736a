"""tiergate's Ethos-U compile: Arm's Vela compiler on one TFLite model, and what it says of each operator.

Runs in the Vela compiler image (containers/vela/compiler.Dockerfile; ethos-u-vela, numpy and flatbuffers only,
never tiergate). Usage:

  python3 tiergate_vela_compile.py --model /in/model.tflite --out /out -- VELA ARGS...
      (VELA ARGS: --accelerator-config A --config Arm/vela.ini --system-config S --memory-mode M --optimise O)

Vela runs as a child process (its Ethos-U85 compiler is C++ that prints on the process's own stdout) with
--verbose-performance and --output-dir; this script then writes into --out:

  model_vela.tflite   the model Vela writes (the NPU's parts as ethos-u custom operators, the rest as they were)
  per-layer.csv       Vela's per-layer estimate (original operator, NPU operator, target, cycles, MACs, name)
  summary.csv         Vela's network summary (inference_time, cycles_*, *_memory_used, ...)
  vela-meta.json      {"vela_version", "args", "accelerator", "system_config", "memory_mode", "seconds",
                       "operators": [{"index", "op", "outputs", "target": "NPU"|"CPU", "reason", "interface"}],
                       "summary": {figures from summary.csv, as numbers}, "layers": [per-layer rows],
                       "model_inputs", "model_outputs"}
  error.json          {"error": Vela's last words} instead, when Vela refuses the model (exit 3)

Each operator of the source model (subgraph 0, in order) is placed on the CPU when the model Vela writes still holds
it as an operator of its own (an operator that writes the same tensor, not Vela's ethos-u custom operator), else on
the NPU. Vela's reason for a CPU operator is its "Warning (supported operators)" line for that operator's output
tensor. `interface`: a QUANTIZE that reads a model input or a DEQUANTIZE that writes a model output (the float
interface of a model whose inside is integer): on the CPU by construction.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time

WARNING = re.compile(r"Warning \(supported operators\) operator: (\S+), ofm: '(.*)'\n((?:.+\n?)*)")
NUMBER = re.compile(r"^-?(\d+\.?\d*(e[-+]?\d+)?|nan|inf)$", re.IGNORECASE)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("vela", nargs=argparse.REMAINDER, help="Vela's options, after --")
    args = p.parse_args(argv)
    args.vela = [a for a in args.vela if a != "--"] if args.vela[:1] == ["--"] else args.vela
    return args


def builtin_names():
    from ethosu.vela.tflite.BuiltinOperator import BuiltinOperator

    return {v: k for k, v in vars(BuiltinOperator).items() if not k.startswith("_")}


def read_ops(path):
    """[(op name, [output tensor names], [input tensor names])] of subgraph 0, and its inputs' and outputs' names."""
    from ethosu.vela.tflite.Model import Model

    with open(path, "rb") as fh:
        buf = fh.read()
    model = Model.GetRootAsModel(buf, 0)
    names = builtin_names()
    codes = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        custom = code.CustomCode()
        codes.append(custom.decode() if custom else names.get(builtin, str(builtin)))
    graph = model.Subgraphs(0)

    def tname(i):
        return graph.Tensors(i).Name().decode("utf-8", "replace") if i >= 0 else ""

    ops = []
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        ops.append((codes[op.OpcodeIndex()], [tname(op.Outputs(j)) for j in range(op.OutputsLength())],
                    [tname(op.Inputs(j)) for j in range(op.InputsLength())]))
    inputs = [tname(graph.Inputs(j)) for j in range(graph.InputsLength())]
    outputs = [tname(graph.Outputs(j)) for j in range(graph.OutputsLength())]
    return ops, inputs, outputs


def reasons(log):
    """{output tensor name: Vela's reason} from its "Warning (supported operators)" blocks."""
    found = {}
    for match in WARNING.finditer(log.replace("\r", "")):
        text = " ".join(line.strip() for line in match.group(3).splitlines() if line.strip())
        found[match.group(2)] = text.removeprefix("Reason: ")
    return found


def number(text):
    text = text.strip()
    if NUMBER.match(text):
        value = float(text)
        return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value
    return text


def read_csv(path):
    with open(path, newline="") as fh:
        return [{k.strip(): number(v) for k, v in row.items() if k is not None} for row in csv.DictReader(fh)]


def placement(source, compiled, why, inputs, outputs):
    """Each source operator: on the CPU when the compiled model still has an operator that writes its output."""
    on_cpu = {}
    for op, outs, _ in compiled:
        if op != "ethos-u":
            for name in outs:
                on_cpu[name] = op
    out = []
    for index, (op, outs, ins) in enumerate(source):
        cpu = any(name in on_cpu for name in outs)
        reason = next((why[name] for name in outs if name in why), "") if cpu else ""
        interface = cpu and ((op == "QUANTIZE" and any(name in inputs for name in ins)) or
                             (op == "DEQUANTIZE" and any(name in outputs for name in outs)))
        out.append({"index": index, "op": op, "outputs": outs, "target": "CPU" if cpu else "NPU",
                    "reason": reason or ("" if not cpu else "left on the CPU by Vela (no reason printed)"),
                    "interface": bool(interface)})
    return out


def fail(out, text, code=3):
    with open(os.path.join(out, "error.json"), "w") as fh:
        json.dump({"error": text}, fh)
    sys.exit(code)


def main(argv=None):
    args = parse_args(argv)
    from ethosu.vela import __version__ as vela_version

    work = os.path.join("/tmp", "vela-out")
    os.makedirs(work, exist_ok=True)
    command = [sys.executable, "-s", "-c", "import sys; from ethosu.vela.vela import main; sys.exit(main())",
               args.model, "--output-dir", work, "--verbose-performance", *args.vela]
    t0 = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    log = proc.stdout + proc.stderr
    stem = os.path.splitext(os.path.basename(args.model))[0]
    files = os.listdir(work)
    summary = next((f for f in files if f.startswith(f"{stem}_summary_") and f.endswith(".csv")), None)
    compiled = f"{stem}_vela.tflite"
    if proc.returncode != 0 or summary is None or compiled not in files:
        lines = [line.strip() for line in log.splitlines() if line.strip()]
        fail(args.out, f"Vela exited with code {proc.returncode}: {lines[-1][:400] if lines else 'no output'}")
    source, inputs, outputs = read_ops(args.model)
    vela_ops, _, _ = read_ops(os.path.join(work, compiled))
    rows = read_csv(os.path.join(work, summary))
    layers = read_csv(os.path.join(work, f"{stem}_per-layer.csv")) if f"{stem}_per-layer.csv" in files else []
    operators = placement(source, vela_ops, reasons(log), inputs, outputs)
    shutil.move(os.path.join(work, compiled), os.path.join(args.out, "model_vela.tflite"))
    shutil.move(os.path.join(work, summary), os.path.join(args.out, "summary.csv"))
    if layers:
        shutil.move(os.path.join(work, f"{stem}_per-layer.csv"), os.path.join(args.out, "per-layer.csv"))
    opt = dict(zip(args.vela[::2], args.vela[1::2]))
    meta = {"vela_version": vela_version, "args": args.vela, "accelerator": opt.get("--accelerator-config", ""),
            "system_config": opt.get("--system-config", ""), "memory_mode": opt.get("--memory-mode", ""),
            "config": opt.get("--config", ""), "optimise": opt.get("--optimise", ""), "seconds": round(seconds, 3),
            "operators": operators, "summary": rows[0] if rows else {},
            "layers": [{"original": r.get("Original Operator", ""), "op": r.get("NNG Operator", ""),
                        "target": r.get("Target", ""), "cycles": r.get("Op Cycles", 0), "macs": r.get("MAC Count", 0),
                        "name": r.get("Name", "")} for r in layers],
            "model_inputs": inputs, "model_outputs": outputs, "vela_ops": [op for op, _, _ in vela_ops]}
    with open(os.path.join(args.out, "vela-meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True, default=str)


if __name__ == "__main__":
    main()
