"""What each model output is, so the gate judges it by what it means (docs/policy.md, "Output kinds").

Kinds:
  class_scores   scores per class (N, C): top-1 accuracy with class labels; agreement without
  detection      boxes and scores. Layouts: `yolo` (one output (N, 4+C, A) or (N, A, 4+C): cx, cy, w, h then
                 class scores), `yolo_objectness` (4 box values, an objectness, then class scores), `ssd` (two
                 outputs: boxes (N, A, 4+k) on this output, scores (N, A, C) on the output named by `scores`,
                 whose own layout is `ssd_scores`),
                 `nms` (detections after non-maximum suppression: (N, K, 6+) as x1, y1, x2, y2, score, class)
  map            a probability map (N, 1, H, W) / (N, H, W, 1) at `threshold`, or class scores per pixel (C > 1)
  ctc            a CTC sequence (N, T, V): greedy decoding with `blank` and an alphabet (`alphabet`: the model's
                 metadata key, e.g. PP-OCR's `character`, or a file of one symbol per line)
  landmarks      points (N, P*D), (N, P, D) or (N, 1, 1, P*D): P points of D coordinates (x, y first)
  embedding      a vector per sample (N, D) compared by cosine and by nearest neighbours
  values         anything else (regression, states): agreement only

`detect(artifact)` finds the common layouts from shapes, metadata and the graph (each with its reason);
`[outputs.NAME]` tables in the policy override or add (`parse_table` checks them); `resolve` merges both.
Stdlib only: a decision holds its kinds and decodes without numpy.
"""

from __future__ import annotations

from dataclasses import fields, replace

from tiergate.outputs.kind import KINDS, LAYOUTS, PARTS, OutputKind, parse_table  # noqa: F401 - re-exported


def resolve(artifact, tables: dict[str, dict] | None = None) -> dict[str, OutputKind]:
    """Every output's kind: the policy's table where there is one (on top of what was detected), else detected.
    A table naming no output of the model is an InputError; so is an alphabet that cannot be read."""
    from tiergate.errors import InputError
    from tiergate.outputs.detect import detect, read_alphabet

    found = detect(artifact)
    names = [o.name for o in artifact.outputs]
    for name, table in (tables or {}).items():
        if name not in names:
            raise InputError(f"policy: [outputs.{name}] names no output of {artifact.path.name} "
                             f"(outputs: {', '.join(names)})")
        base = found.get(name)
        kind = table.get("kind", base.kind if base else "values")
        settings = {k: v for k, v in table.items() if k not in ("kind", "alphabet")}
        known = {f.name for f in fields(OutputKind)}
        start = base if base is not None and base.kind == kind else OutputKind(name, kind)
        kind_ = replace(start, **{k: v for k, v in settings.items() if k in known}, kind=kind, source="policy",
                        why=f"[outputs.{name}] in the policy")
        if "alphabet" in table or (kind == "ctc" and not kind_.alphabet and base is None):
            alphabet, source = read_alphabet(artifact, table.get("alphabet", ""), kind_)
            kind_ = replace(kind_, alphabet=alphabet, alphabet_size=len(alphabet), alphabet_source=source)
        found[name] = kind_
    for name, kind_ in found.items():
        if kind_.kind == "detection" and kind_.layout == "ssd" and kind_.scores not in names:
            raise InputError(f"policy: [outputs.{name}] layout \"ssd\" needs scores = \"OUTPUT\", the output "
                             f"holding the scores (outputs: {', '.join(names)})")
    return found
