"""The common output layouts found from an artifact's shapes, metadata and graph, each with its reason.

What it recognises (docs/policy.md, "Output kinds"; a policy's [outputs.NAME] overrides any of it):
- ctc: (N, T, V) from a softmax over V, or with an alphabet in the metadata that fits V (PP-OCR's `character`:
  blank first, a space appended when V is two more than its lines)
- detection: `yolo` (N, 4+C, A) / (N, A, 4+C) with A >= 100 anchors (`yolo_objectness` when the metadata's
  class names leave 5 + C, or (N, A, 5+C) without names); `ssd`: two outputs (N, A, 4+k) and (N, A, C) with the
  same A >= 100; `nms`: (N, K, 6 or 7) after a NonMaxSuppression or TFLite_Detection_PostProcess op
- map: (N, C, H, W) or (N, H, W, C) whose spatial size is the image input's (or as open as it), C <= 64
- landmarks: a known point count (hands 21, faces 468 / 478 / 68 / 98 / 106, bodies 33 / 39, eyes 71) times
  2, 3, 4 or 5 values, on an image model, not made by a softmax or sigmoid (class scores)
- embedding: (N, D), D >= 16, made by an L2 normalization (LpNormalization, x / ReduceL2, L2_NORMALIZATION)
- class_scores: (N, C) with C >= 2, or (N, C, 1, 1); everything else is `values`.
"""

from __future__ import annotations

from pathlib import Path

from tiergate.outputs.kind import OutputKind

KNOWN_POINTS = {21: "hand", 33: "body", 39: "body", 468: "face mesh", 478: "face mesh with irises", 68: "face",
                98: "face (WFLW)", 106: "face", 71: "eye contour"}
ALPHABET_KEYS = ("character", "characters", "alphabet", "vocab", "charset")
NMS_OPS = ("NonMaxSuppression", "TFLite_Detection_PostProcess")
_SOFTMAX = ("Softmax", "LogSoftmax", "SOFTMAX", "LOG_SOFTMAX")
_SIGMOID = ("Sigmoid", "LOGISTIC", "HardSigmoid")
_L2 = ("LpNormalization", "L2_NORMALIZATION")


def _fixed(d) -> bool:
    return isinstance(d, int) and d > 0


def _dims(shape) -> str:
    return "[" + ", ".join(str(d) if _fixed(d) else "?" for d in shape) + "]"


def _image_input(artifact):
    """(the image input's spatial dims, channels_first) for a 4-D input with 1 or 3 channels, else None."""
    for spec in artifact.inputs:
        shape = spec.shape
        if len(shape) != 4:
            continue
        if shape[1] in (1, 3, 4) and not (shape[3] in (1, 3, 4) and _fixed(shape[1]) and shape[1] > shape[3]):
            return (shape[2], shape[3]), True
        if shape[3] in (1, 3, 4):
            return (shape[1], shape[2]), False
    return None


def detect(artifact) -> dict[str, OutputKind]:
    """{output: kind} for every output of `artifact`."""
    producers = {out: node for node in artifact.nodes if not node.scope for out in node.outputs}
    ops = {node.op for node in artifact.nodes}
    image = _image_input(artifact)
    specs = list(artifact.outputs)
    found: dict[str, OutputKind] = {}
    _ssd(specs, found, image)
    for spec in specs:
        if spec.name in found:
            continue
        found[spec.name] = (_ctc(artifact, spec, producers) or _nms(spec, ops) or _yolo(artifact, spec, producers)
                            or _map(spec, image) or _landmarks(spec, image, producers) or _embedding(spec, producers)
                            or _class_scores(spec) or OutputKind(spec.name, "values", why="no known layout"))
    return found


def _producer_op(producers, name: str) -> str:
    node = producers.get(name)
    while node is not None and node.op in ("Identity", "Reshape", "RESHAPE", "Transpose", "TRANSPOSE", "Squeeze",
                                           "Unsqueeze", "Flatten", "DEQUANTIZE", "DequantizeLinear"):
        node = producers.get(node.inputs[0]) if node.inputs else None
    return node.op if node is not None else ""


def _ctc(artifact, spec, producers) -> OutputKind | None:
    shape = spec.shape
    if len(shape) != 3 or not _fixed(shape[2]) or shape[2] < 3:
        return None
    vocab = shape[2]
    key = next((k for k in ALPHABET_KEYS if k in artifact.metadata), None)
    if key is not None:
        lines = artifact.metadata[key].splitlines()
        alphabet = _fit_alphabet(lines, vocab)
        if alphabet:
            return OutputKind(spec.name, "ctc", why=f"(N, T, {vocab}) with the {len(lines)}-symbol alphabet in the "
                              f"metadata's '{key}'", alphabet_source=f"metadata:{key}", alphabet_size=len(alphabet),
                              alphabet=alphabet)
    if _producer_op(producers, spec.name) in _SOFTMAX and not _fixed(shape[1]):
        return OutputKind(spec.name, "ctc", why=f"(N, T, {vocab}) from a softmax over {vocab} symbols along an "
                          "open time axis (no alphabet: decoded to symbol indices)")
    return None


def _fit_alphabet(lines: list[str], vocab: int) -> tuple[str, ...]:
    """The alphabet by index for V symbols: blank first; PP-OCR appends a space (V = lines + 2)."""
    if vocab == len(lines) + 2:
        return ("", *lines, " ")
    if vocab == len(lines) + 1:
        return ("", *lines)
    if vocab == len(lines):
        return tuple(lines)
    return ()


def read_alphabet(artifact, spec: str, kind: OutputKind) -> tuple[tuple[str, ...], str]:
    """A policy's `alphabet`: "metadata:KEY" or a file of one symbol per line (blank first unless it fits as is)."""
    from tiergate.errors import InputError

    where = f"policy: [outputs.{kind.output}] alphabet"
    if not spec:
        raise InputError(f"{where}: a CTC output needs alphabet = \"metadata:KEY\" or a file of one symbol per line")
    if spec.startswith("metadata:"):
        key = spec.removeprefix("metadata:")
        if key not in artifact.metadata:
            raise InputError(f"{where}: the model has no metadata '{key}' (it has: "
                             f"{', '.join(sorted(artifact.metadata)) or 'none'})")
        lines = artifact.metadata[key].splitlines()
    else:
        try:
            lines = Path(spec).read_text("utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{where}: cannot read {spec} ({exc})") from None
    vocab = next((o.shape[2] for o in artifact.outputs if o.name == kind.output and len(o.shape) == 3
                  and _fixed(o.shape[2])), None)
    alphabet = _fit_alphabet(lines, vocab) if vocab else ("", *lines)
    if not alphabet:
        raise InputError(f"{where}: {len(lines)} symbols do not fit the output's {vocab} (blank first, "
                         "and PP-OCR's trailing space: the symbols, one or two more)")
    return alphabet, spec


def _ssd(specs, found: dict, image) -> None:
    """Two outputs over the same anchors: boxes (N, A, 4+k) and scores (N, A, C)."""
    three = [s for s in specs if len(s.shape) == 3 and _fixed(s.shape[1]) and s.shape[1] >= 100
             and _fixed(s.shape[2])]
    for boxes in three:
        for scores in three:
            if boxes is scores or boxes.shape[1] != scores.shape[1] or boxes.name in found or scores.name in found:
                continue
            if boxes.shape[2] >= 4 and scores.shape[2] < boxes.shape[2] and (
                    scores.shape[2] <= 4 or "score" in scores.name.lower() or "class" in scores.name.lower()):
                why = f"boxes {_dims(boxes.shape)} and scores {_dims(scores.shape)} over the same {boxes.shape[1]} anchors"
                found[boxes.name] = OutputKind(boxes.name, "detection", "ssd", why=why, scores=scores.name,
                                               box_format="anchor offsets",
                                               input_size=tuple(d for d in image[0] if _fixed(d)) if image else ())
                found[scores.name] = OutputKind(scores.name, "detection", "ssd_scores",
                                                why=f"the scores of '{boxes.name}' (ssd)")


def _nms(spec, ops) -> OutputKind | None:
    shape = spec.shape
    nms = [op for op in NMS_OPS if op in ops]
    if not nms or len(shape) != 3 or shape[2] not in (6, 7):
        return None
    return OutputKind(spec.name, "detection", "nms", why=f"(N, K, {shape[2]}) after {nms[0]}", box_format="xyxy",
                      score_threshold=0.25)


def _class_count(artifact) -> int | None:
    names = artifact.metadata.get("names")
    if not names:
        return None
    text = names.strip()
    if text.startswith("{"):
        return text.count(":")
    return len([n for n in text.replace("[", "").replace("]", "").split(",") if n.strip()])


def _yolo(artifact, spec, producers) -> OutputKind | None:
    shape = spec.shape
    if len(shape) != 3 or not (_fixed(shape[1]) and _fixed(shape[2])):
        return None
    first = shape[1] < shape[2]
    channels, anchors = (shape[1], shape[2]) if first else (shape[2], shape[1])
    if anchors < 100 or channels < 5 or channels > 1000:
        return None
    classes = _class_count(artifact)
    if classes is not None and channels == 5 + classes:
        layout, why = "yolo_objectness", f"with {classes} class names in the metadata: 4 box values, objectness"
    elif classes is not None and channels == 4 + classes:
        layout, why = "yolo", f"with {classes} class names in the metadata"
    elif first:
        layout, why = "yolo", "channels first (ultralytics' YOLOv8 and later)"
    else:
        layout, why = "yolo_objectness", "anchors first (YOLOv5's export: objectness after the box)"
    return OutputKind(spec.name, "detection", layout, channels_first=first, box_format="cxcywh",
                      why=f"{_dims(shape)}: {anchors} anchors of {channels} values, {why}")


def _map(spec, image) -> OutputKind | None:
    shape = spec.shape
    if len(shape) != 4 or image is None:
        return None
    (h, w), first = image
    spatial, channels = ((shape[2], shape[3]), shape[1]) if first else ((shape[1], shape[2]), shape[3])
    if not _fixed(channels) or channels > 64:
        return None
    same = all((not _fixed(a) and not _fixed(b)) or a == b for a, b in zip(spatial, (h, w)))
    if not same:
        return None
    layout = "probability" if channels == 1 else "classes"
    return OutputKind(spec.name, "map", layout, channels_first=first,
                      why=f"{_dims(shape)}: {channels} channel(s) at the input's spatial size",
                      input_size=tuple(d for d in (h, w) if _fixed(d)))


def _landmarks(spec, image, producers) -> OutputKind | None:
    shape = spec.shape
    if image is None or not shape or not all(_fixed(d) for d in shape[1:]) or \
            _producer_op(producers, spec.name) in _SOFTMAX + _SIGMOID:
        return None
    per = 1
    for d in shape[1:]:
        per *= d
    if len(shape) == 3 and shape[2] in (2, 3, 4, 5) and shape[1] in KNOWN_POINTS:
        points, dims = shape[1], shape[2]
    else:
        if len(shape) == 4 and (shape[1] != 1 or shape[2] != 1):
            return None
        options = [(per // d, d) for d in (3, 2, 5, 4) if per % d == 0 and per // d in KNOWN_POINTS]
        if len(shape) not in (2, 4) or not options:
            return None
        points, dims = options[0]
    (h, w), _ = image
    return OutputKind(spec.name, "landmarks", points=points, dims=dims,
                      why=f"{points} points x {dims} values ({KNOWN_POINTS[points]} landmarks) on an image model",
                      input_size=tuple(d for d in (h, w) if _fixed(d)))


def _embedding(spec, producers) -> OutputKind | None:
    shape = spec.shape
    if len(shape) != 2 or not _fixed(shape[1]) or shape[1] < 16:
        return None
    node = producers.get(spec.name)
    op = _producer_op(producers, spec.name)
    l2 = op in _L2
    if not l2 and node is not None and op == "Div" and len(node.inputs) == 2:
        divisor = producers.get(node.inputs[1])
        seen = 0
        while divisor is not None and seen < 4 and not l2:
            l2 = divisor.op in ("ReduceL2", "Sqrt")
            divisor = producers.get(divisor.inputs[0]) if divisor.inputs else None
            seen += 1
    if not l2:
        return None
    return OutputKind(spec.name, "embedding", why=f"(N, {shape[1]}) made by an L2 normalization")


def _class_scores(spec) -> OutputKind | None:
    shape = spec.shape
    if len(shape) == 2 and (not _fixed(shape[1]) or shape[1] >= 2):
        return OutputKind(spec.name, "class_scores", why=f"{_dims(shape)}: scores per sample")
    if len(shape) == 4 and _fixed(shape[1]) and shape[1] >= 2 and shape[2:] == (1, 1):
        return OutputKind(spec.name, "class_scores", why=f"{_dims(shape)}: scores per sample")
    return None
