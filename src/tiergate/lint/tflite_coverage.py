"""What a LiteRT (TFLite) runtime runs natively: builtin ops in its kernel set, and of
those, which the XNNPACK delegate (the default CPU accelerator) takes.

Where ai-edge-litert is installed, the delegate itself is asked: the model is
loaded into a LiteRT interpreter (which applies XNNPACK) and the nodes each
DELEGATE node replaced are read back. Without it, XNNPACK_BUILTINS is used: the
builtin codes the XNNPACK delegate's VisitNode switch accepts in
tensorflow/lite/delegates/xnnpack/xnnpack_delegate.cc (an older TensorFlow
release, so conservative: newer releases take more ops, and XNNPACK may still
refuse a listed op for its types or shapes). Custom ops need a kernel the
application registers; Flex (SELECT_TF_OPS) ops need the Flex delegate, which
stock LiteRT (ai-edge-litert, tflite-runtime) does not ship.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

XNNPACK_BUILTINS = frozenset({
    "ABS", "ADD", "AVERAGE_POOL_2D", "BATCH_MATMUL", "CEIL", "CONCATENATION", "CONV_2D",
    "DEPTHWISE_CONV_2D", "DEPTH_TO_SPACE", "DEQUANTIZE", "DIV", "ELU", "FLOOR", "FULLY_CONNECTED",
    "GELU", "HARD_SWISH", "LEAKY_RELU", "LOGISTIC", "MAXIMUM", "MAX_POOL_2D", "MEAN", "MINIMUM",
    "MUL", "NEG", "PAD", "PRELU", "QUANTIZE", "RELU", "RELU6", "RELU_N1_TO_1", "RESHAPE",
    "RESIZE_BILINEAR", "ROUND", "RSQRT", "SLICE", "SOFTMAX", "SPACE_TO_DEPTH", "SPLIT", "SQRT",
    "SQUARE", "SQUARED_DIFFERENCE", "STRIDED_SLICE", "SUB", "TANH", "TRANSPOSE", "TRANSPOSE_CONV",
})


def classify(node, delegated: set[int] | None = None) -> tuple[str, str] | None:
    """(severity, reason) when the node does not run natively on LiteRT + XNNPACK; None when it does.

    `delegated`: the nodes the installed delegate takes (delegated_nodes), or None to use the static list.
    """
    if node.domain == "flex":
        return "error", (f"{node.op} is a SELECT_TF_OPS (Flex) op: it needs the TensorFlow Flex delegate, "
                         f"which stock LiteRT does not include")
    if node.domain == "custom":
        if delegated is not None:       # the installed LiteRT loaded the model: it resolves the op, no refusal
            how = ("only because its XNNPACK delegate takes it (a LiteRT without XNNPACK cannot load it)"
                   if node.index in delegated else "with a kernel it registers itself")
            return "warning", f"custom op {node.op!r} is not a TFLite builtin: the installed LiteRT runs it {how}"
        return "error", (f"custom op {node.op!r} is not a TFLite builtin: it runs only where the application "
                         f"registers a kernel for it")
    taken = node.op in XNNPACK_BUILTINS if delegated is None else node.index in delegated
    if not taken:
        source = "static XNNPACK op list" if delegated is None else "asked of the installed LiteRT"
        return "warning", (f"{node.op} is not taken by the XNNPACK delegate ({source}): it falls back to "
                           f"LiteRT's builtin CPU kernel and splits the delegated graph")
    return None


@contextmanager
def _quiet_stderr():
    """LiteRT logs delegate creation on file descriptor 2; keep it off the user's terminal."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def delegated_nodes(artifact) -> set[int] | None:
    """Indices of the nodes the installed LiteRT's XNNPACK delegate takes; None when it cannot be asked."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return None
    try:
        with _quiet_stderr():
            interpreter = Interpreter(model_content=bytes(artifact.handle.data), num_threads=1)
            interpreter.allocate_tensors()
            details = interpreter._get_ops_details()
    except Exception:  # noqa: BLE001 - e.g. an unresolved custom op: fall back to the static list
        return None
    count = len(artifact.nodes)
    producer = {int(t): d["index"] for d in details[:count] for t in d["outputs"]}
    covered: set[int] = set()
    for delegate in details[count:]:
        stop = {int(t) for t in delegate["inputs"]}
        todo = [int(t) for t in delegate["outputs"]]
        while todo:
            tensor = todo.pop()
            node = producer.get(tensor)
            if tensor in stop or node is None or node in covered:
                continue
            covered.add(node)
            todo.extend(int(t) for t in details[node]["inputs"] if int(t) >= 0)
    return covered
