"""unsupported-op: an op (or the model) the device class's runtime cannot run natively.

ONNX (onnxruntime, onnxruntime-gpu): no kernel in the execution provider for the op,
its opset version or its element types (asked of onnxruntime's kernel registry).
On the CPU EP that means the session cannot be created (error); on the CUDA EP the
node falls back to the CPU (warning). Judged on the file, the host's onnxruntime is
always asked to create a session (no inference): a refusal no node explains (an IR
version or opset newer than it reads, a kernel its registry lists but cannot build, a
locale a kernel needs at start) is one error on the model, in the runtime's words.
With the tier's runtime graph described, its own session decides. TFLite: custom and
Flex ops (error), and builtins the XNNPACK delegate does not take (warning). TVM (a class that
compiles the ONNX model): the compile decides; a model it cannot import or compile is the tier's
refusal (error, in TVM's words), else nothing.
"""

from __future__ import annotations

from dataclasses import replace

from tiergate.lint import ort_coverage, tflite_coverage

RULE = "unsupported-op"
SEVERITY = "error"
DESCRIPTION = "op (or model) the device class's runtime cannot run natively (falls back or fails)"

_FORMAT_OF_RUNTIME = {"onnxruntime": "onnx", "onnxruntime-gpu": "onnx", "tflite": "tflite", "tvm": "onnx",
                      "ethos-u": "tflite"}
_DEFAULT_RUNTIME = {"onnx": "onnxruntime", "tflite": "tflite"}


def check(ctx) -> list:
    artifact = ctx.artifact
    runtime = ctx.device_class.runtime if ctx.device_class else _DEFAULT_RUNTIME[artifact.format]
    if _FORMAT_OF_RUNTIME.get(runtime) != artifact.format:
        target = f"device class {ctx.device_class.name!r} " if ctx.device_class else ""
        return [ctx.finding(RULE, "error", f"this {artifact.format.upper()} artifact cannot run on {target}runtime {runtime}")]
    described = ctx.runtime
    if described is not None and not described.ok:
        version = ", ".join(f"{k} {v}" for k, v in described.versions.items()) or runtime
        ort = artifact.format == "onnx" and runtime != "tvm"     # onnxruntime's words (TVM's are its compile's)
        words = ort_coverage.runtime_words(described.error) if ort else described.error
        why = ort_coverage.why_refused(words, described.versions.get("onnxruntime") or "(version not reported)") \
            if ort else ""
        return [_runtime_finding(ctx, ctx.finding(
            RULE, "error", f"tier {described.tier} ({described.target}, {version}, {described.machine}) "
                           f"refuses the model: " + (f"{why} (it says: {words})" if why else words)))]
    if runtime == "ethos-u":
        return []     # Vela decides what runs where (npu-fallback); LiteRT's reference kernels run every builtin
    if runtime == "tvm":
        return []     # TVM's frontend and compile decide (a model they refuse is a refusal above), not ORT's kernels
    if artifact.format == "tflite":
        return _tflite_described(ctx) if described is not None else _tflite(ctx)
    if described is not None:
        # the tier's runtime loaded the model: nothing in it is unsupported there
        return [f for f in _onnx(ctx, runtime, ask=False) if f.severity != "error"]
    return _onnx(ctx, runtime, ask=True)


def _tflite(ctx) -> list:
    findings = []
    delegated = tflite_coverage.delegated_nodes(ctx.artifact)
    for node in ctx.artifact.nodes:
        verdict = tflite_coverage.classify(node, delegated)
        if verdict:
            findings.append(ctx.finding(RULE, verdict[0], verdict[1], [node.index]))
    return findings


def _tflite_described(ctx) -> list:
    """What the tier's LiteRT did (asked in its container): nodes XNNPACK did not take, and custom
    ops that only the delegate resolves (the model loads only while XNNPACK takes them)."""
    described, findings = ctx.runtime, []
    where = f"{described.target}, {described.machine}"
    for index, op, placed in described.nodes:
        node = ctx.artifact.nodes[index] if index < len(ctx.artifact.nodes) else None
        if node is None or node.op != op:
            continue
        if node.domain in ("custom", "flex") and placed == "xnnpack" and described.needs_delegate:
            findings.append(_named(ctx, "warning",
                                   f"custom op {op!r} loads only because the XNNPACK delegate takes it on {where}; "
                                   f"without the delegate LiteRT says: {described.needs_delegate[0]}", index))
        elif placed != "xnnpack":
            findings.append(_named(ctx, "warning",
                                   f"{op} is not taken by the XNNPACK delegate on {where}: it runs on LiteRT's "
                                   f"default CPU kernel and splits the delegated graph", index))
    return findings


def _named(ctx, severity: str, message: str, index: int):
    return _runtime_finding(ctx, ctx.finding(RULE, severity, message, [index]))


def _runtime_finding(ctx, finding):
    """A finding read from what the tier's runtime did in its container: it names the tier."""
    return replace(finding, basis="runtime", target=ctx.runtime.target)


def _onnx(ctx, runtime: str, *, ask: bool) -> list:
    provider, severity, findings = "CPUExecutionProvider", "error", []
    if runtime == "onnxruntime-gpu":
        if ort_coverage.has_provider("CUDAExecutionProvider"):
            provider, severity = "CUDAExecutionProvider", "warning"
        else:
            findings.append(ctx.finding(RULE, "info", "CUDA execution provider coverage not checked: this "
                                        "onnxruntime build registers no CUDA kernels; checked against the CPU EP "
                                        "that unsupported nodes fall back to"))
    model = ctx.artifact.handle
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    refused: list[tuple[int, str]] = []
    for node in ctx.artifact.nodes:
        verdict = ort_coverage.check_node(node, opsets, ctx.artifact.tensor_dtypes, provider)
        if verdict.folded:
            continue
        if verdict.decomposed:
            findings.append(ctx.finding(RULE, "info", verdict.reason, [node.index]))
        elif verdict.cast_fallback:
            findings.append(ctx.finding(RULE, "warning", verdict.reason, [node.index]))
        elif not verdict.ok and severity == "warning":
            findings.append(ctx.finding(RULE, severity, verdict.reason + " (falls back to the CPU EP)", [node.index]))
        elif not verdict.ok:
            refused.append((node.index, verdict.reason))
    return findings + (_confirm_on_cpu(ctx, refused) if ask else [])


def _confirm_on_cpu(ctx, refused: list[tuple[int, str]]) -> list:
    """The host onnxruntime creates a session for the model (no inference). No kernel listed is an error only
    when it really refuses the model; else the op is rewritten or folded at load (info). A refusal no node
    explains is one error on the model."""
    problem = ort_coverage.load_problem(ctx.artifact.path)
    if problem is None:
        return [ctx.finding(RULE, "info", f"{reason}, but onnxruntime loads the model (rewritten or folded at load)",
                            [i]) for i, reason in refused]
    if refused:
        return [ctx.finding(RULE, "error", f"{reason}: onnxruntime refuses the model: {problem}", [i])
                for i, reason in refused]
    why = ort_coverage.why_refused(problem)
    return [ctx.finding(RULE, "error", f"{_host(ctx)} refuses to create a session for the model"
                        + (f": {why}" if why else "") + f" (it says: {problem})")]


def _host(ctx) -> str:
    """The host's onnxruntime, and the class's version where that differs (--target asks the class's own)."""
    version = ort_coverage.host_version()
    wanted = getattr(ctx.device_class, "runtime_version", "") or version
    if wanted != version:
        return (f"the host's onnxruntime {version} (the class {ctx.device_class.name} runs {wanted}: "
                "--target describes it in the class's own runtime)")
    return f"onnxruntime {version}"
