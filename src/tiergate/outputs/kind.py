"""One output's kind (tiergate.outputs) and a policy's [outputs.NAME] table of it: stdlib only, so a decision
holds its kinds and decodes without numpy."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

KINDS = ("class_scores", "detection", "map", "ctc", "landmarks", "embedding", "values")
LAYOUTS = {"detection": ("yolo", "yolo_objectness", "ssd", "ssd_scores", "nms"), "map": ("probability", "classes")}
BOX_FORMATS = ("cxcywh", "xyxy", "xywh", "yxyx")
NORMALIZE = ("bbox", "image", "none")
# how a detector's layout splits its outputs into parts judged apart (agreement per part)
PARTS = {"yolo": ("boxes", "scores"), "yolo_objectness": ("boxes", "objectness", "scores"),
         "nms": ("boxes", "scores", "classes")}


@dataclass(frozen=True)
class OutputKind:
    """One output's kind and what its decoding needs; `source` "detected" (with `why`) or "policy"."""

    output: str
    kind: str
    layout: str = ""
    source: str = "detected"
    why: str = ""
    scores: str = ""                  # ssd: the output holding the scores (this one holds the boxes)
    box_format: str = ""              # detection: cxcywh (yolo), xyxy (nms), ...
    channels_first: bool = True       # yolo: (N, 4+C, A); False: (N, A, 4+C). map: (N, C, H, W); False: NHWC
    score_threshold: float = 0.25     # detection: a detection's least score (yolo's default confidence)
    iou_threshold: float = 0.7        # detection: non-maximum suppression's IoU (ultralytics' val default)
    threshold: float = 0.5            # map: a pixel is foreground at >= threshold
    alphabet_source: str = ""         # ctc: "metadata:KEY" or a file path
    alphabet_size: int = 0
    blank: int = 0                    # ctc: the blank's index
    points: int = 0                   # landmarks: P
    dims: int = 0                     # landmarks: D
    normalize: str = "bbox"           # landmarks: error / the diagonal of the truth's box, the input's size, none
    input_size: tuple[int, ...] = ()  # the model input's spatial size (H, W), when fixed
    alphabet: tuple[str, ...] = field(default=(), repr=False)   # not in a decision's JSON (its size and source are)

    def summary(self) -> "OutputKind":
        """As a decision records it: without the alphabet's symbols."""
        return replace(self, alphabet=())

    @property
    def text(self) -> str:
        extra = self.layout or ""
        if self.kind == "ctc":
            extra = f"alphabet {self.alphabet_size} from {self.alphabet_source}" if self.alphabet_size else \
                "no alphabet: symbol indices"
        elif self.kind == "landmarks" and self.points:
            extra = f"{self.points} points x {self.dims}"
        elif self.kind == "detection" and self.scores:
            extra += f", scores in '{self.scores}'"
        return f"{self.kind}" + (f" ({extra})" if extra else "")


# --- the policy's [outputs.NAME] tables ----------------------------------------------------------------

TABLE_KEYS = {"kind": str, "layout": str, "scores": str, "box_format": str, "channels_first": bool,
              "score_threshold": float, "iou_threshold": float, "threshold": float, "alphabet": str,
              "blank": int, "points": int, "dims": int, "normalize": str}


def parse_table(where: str, table) -> dict:
    """A policy's `[outputs.NAME]` table, checked (InputError naming `where` and the key)."""
    from tiergate.errors import InputError

    if not isinstance(table, dict):
        raise InputError(f"{where} must be a table")
    out = {}
    for key, value in table.items():
        kind = TABLE_KEYS.get(key)
        if kind is None:
            raise InputError(f"{where}: unknown key '{key}' (known: {', '.join(TABLE_KEYS)})")
        if kind is bool:
            ok = isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        elif kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1
        else:
            ok = isinstance(value, str) and value != ""
        if not ok:
            want = {bool: "true or false", int: "a whole number >= 0", float: "a number from 0 to 1",
                    str: "a string"}[kind]
            raise InputError(f"{where} {key} must be {want}, got {value!r}")
        out[key] = float(value) if kind is float else value
    choices = {"kind": KINDS, "box_format": BOX_FORMATS, "normalize": NORMALIZE}
    for key, allowed in choices.items():
        if key in out and out[key] not in allowed:
            raise InputError(f"{where} {key} must be one of {', '.join(allowed)}, got {out[key]!r}")
    if "layout" in out:
        allowed = LAYOUTS.get(out.get("kind", ""), sum(LAYOUTS.values(), ()))
        if out["layout"] not in allowed:
            raise InputError(f"{where} layout must be one of {', '.join(allowed)}, got {out['layout']!r}")
    return out
