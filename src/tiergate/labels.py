"""Labels that are not one number per sample: texts and boxes.

- Texts (text recognition, speech): one string per sample, a 1-D unicode array `labels` in the .npz, a side
  file of one text per line, or a loader's `str` label.
- Boxes (detection): a list per sample, in a COCO-style JSON side file, or a loader's dict label
  `{"boxes": [[x, y, w, h], ...], "categories": [...]}` (categories default to 0).

A side file is named by the .npz: `labels` a 0-d string holding its path, relative to the archive's folder:
`NAME.txt` (UTF-8, line i is sample i's text; the file's last newline ends the last line) or `NAME.json`
(COCO-style: "images" a list in sample order, each with a unique "id"; "annotations" a list of objects with
"image_id", "bbox" [x, y, width, height] in the model input's pixels and "category_id" (optional, 0); an
optional "categories" list of {"id", "name"}). Every problem is one line naming the file and what is wrong.

Boxes travel in an archive as one JSON member (`RAGGED_MEMBER`), so the archive's hash covers them and an early
decision's chunks carry their own samples' boxes; texts as the `labels` array itself.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tiergate.errors import InputError

LABELS = "labels"                      # the archive member of numbers and texts
RAGGED_MEMBER = "__tiergate_boxes__"
MAX_SIDE_FILE_BYTES = 256 * 2 ** 20


@dataclass(frozen=True)
class BoxLabels:
    """Boxes per sample: `boxes[i]` (k, 4) float64 [x, y, width, height] in input pixels, `categories[i]` (k,)."""

    boxes: tuple[np.ndarray, ...]
    categories: tuple[np.ndarray, ...]
    names: tuple[tuple[int, str], ...] = ()
    ndim = 1                        # a 1-D sequence of samples to the checks that ask (never class indices)
    dtype = np.dtype(object)

    def __len__(self) -> int:
        return len(self.boxes)

    @property
    def size(self) -> int:
        return len(self.boxes)

    def __getitem__(self, rows) -> "BoxLabels":
        index = np.arange(len(self))[rows]
        index = np.atleast_1d(index)
        return BoxLabels(tuple(self.boxes[i] for i in index), tuple(self.categories[i] for i in index), self.names)

    def sample_bytes(self, i: int) -> bytes:
        return self.boxes[i].astype("<f8").tobytes() + b"|" + self.categories[i].astype("<i8").tobytes()

    def to_json(self) -> str:
        return json.dumps({"boxes": [b.tolist() for b in self.boxes], "categories": [c.tolist() for c in self.categories],
                           "names": [list(n) for n in self.names]}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> "BoxLabels":
        try:
            doc = json.loads(text)
            boxes = tuple(np.asarray(b, np.float64).reshape(-1, 4) for b in doc["boxes"])
            cats = tuple(np.asarray(c, np.int64).reshape(-1) for c in doc["categories"])
            names = tuple((int(i), str(n)) for i, n in doc.get("names", []))
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{where}: '{RAGGED_MEMBER}' is not tiergate's boxes JSON ({exc})") from None
        if len(boxes) != len(cats):
            raise InputError(f"{where}: '{RAGGED_MEMBER}' has {len(boxes)} box lists but {len(cats)} category lists")
        return cls(boxes, cats, names)

    @property
    def count(self) -> int:
        return sum(len(b) for b in self.boxes)


def is_texts(labels) -> bool:
    return isinstance(labels, np.ndarray) and labels.ndim == 1 and labels.dtype.kind == "U"


def is_ragged(labels) -> bool:
    """Texts or boxes: labels no number-based metric reads."""
    return isinstance(labels, BoxLabels) or is_texts(labels)


def members(labels) -> dict[str, np.ndarray]:
    """The archive members that carry `labels`: `labels` for numbers and texts, the JSON member for boxes."""
    if isinstance(labels, BoxLabels):
        return {RAGGED_MEMBER: np.array(labels.to_json())}
    return {LABELS: np.asarray(labels)}


def sample_bytes(labels, i: int) -> bytes:
    """One sample's label as bytes (its identity in an early decision's partition)."""
    if isinstance(labels, BoxLabels):
        return labels.sample_bytes(i)
    one = np.ascontiguousarray(np.asarray(labels)[i])
    return f"{one.dtype.str}\0{one.shape}\0".encode() + one.tobytes()


# --- side files -------------------------------------------------------------------------------------


def read_side_file(name: str, archive: Path) -> np.ndarray | BoxLabels:
    """The labels in the side file `name` (relative to the archive's folder): texts or boxes."""
    where = f"evaluation data {archive}: labels file '{name}'"
    if not name or "\0" in name:
        raise InputError(f"{where}: not a file name")
    path = (archive.parent / name) if not Path(name).is_absolute() else Path(name)
    if path.suffix.lower() not in (".txt", ".json"):
        raise InputError(f"{where}: must end in .txt (one text per line) or .json (COCO-style boxes)")
    try:
        if not path.is_file():
            raise InputError(f"{where}: {path} does not exist or is not a regular file")
        if path.stat().st_size > MAX_SIDE_FILE_BYTES:
            raise InputError(f"{where}: larger than {MAX_SIDE_FILE_BYTES // 2 ** 20} MB")
        text = path.read_text("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise InputError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    if path.suffix.lower() == ".txt":
        return texts_from_lines(text)
    return boxes_from_coco(text, where)


def texts_from_lines(text: str) -> np.ndarray:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return np.array([line.removesuffix("\r") for line in lines], dtype=str) if lines else np.array([], dtype="<U1")


def boxes_from_coco(text: str, where: str) -> BoxLabels:
    """COCO-style JSON: images in sample order, annotations by image id (docstring above)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise InputError(f"{where}: must be a JSON object with an \"images\" list (COCO-style), one per sample in "
                         "sample order")
    order: dict = {}
    for i, image in enumerate(doc["images"]):
        if not isinstance(image, dict) or "id" not in image or isinstance(image["id"], (dict, list, float)):
            raise InputError(f"{where}: images[{i}] must be an object with an integer or string \"id\"")
        if image["id"] in order:
            raise InputError(f"{where}: images[{i}] repeats id {image['id']!r} (ids must be unique)")
        order[image["id"]] = i
    annotations = doc.get("annotations", [])
    if not isinstance(annotations, list):
        raise InputError(f"{where}: \"annotations\" must be a list")
    boxes: list[list] = [[] for _ in order]
    cats: list[list] = [[] for _ in order]
    for j, ann in enumerate(annotations):
        if not isinstance(ann, dict):
            raise InputError(f"{where}: annotations[{j}] must be an object")
        if ann.get("image_id") not in order:
            raise InputError(f"{where}: annotations[{j}] names image_id {ann.get('image_id')!r}, which no image has")
        bbox = ann.get("bbox")
        if (not isinstance(bbox, list) or len(bbox) != 4
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox)
                or bbox[2] < 0 or bbox[3] < 0):
            raise InputError(f"{where}: annotations[{j}] \"bbox\" must be [x, y, width, height], four finite "
                             f"numbers with width and height not negative; got {bbox!r}")
        category = ann.get("category_id", 0)
        if isinstance(category, bool) or not isinstance(category, int):
            raise InputError(f"{where}: annotations[{j}] \"category_id\" must be an integer, got {category!r}")
        boxes[order[ann["image_id"]]].append([float(v) for v in bbox])
        cats[order[ann["image_id"]]].append(category)
    names = []
    for k, cat in enumerate(doc.get("categories", []) or []):
        if not isinstance(cat, dict) or isinstance(cat.get("id"), bool) or not isinstance(cat.get("id"), int):
            raise InputError(f"{where}: categories[{k}] must be an object with an integer \"id\"")
        names.append((cat["id"], str(cat.get("name", cat["id"]))))
    return BoxLabels(tuple(np.asarray(b, np.float64).reshape(-1, 4) for b in boxes),
                     tuple(np.asarray(c, np.int64).reshape(-1) for c in cats), tuple(names))


# --- a loader's labels --------------------------------------------------------------------------------


def loader_label(where: str, label):
    """A loader's label of one sample: ("text", str), ("boxes", (boxes, categories)) or ("number", array)."""
    if isinstance(label, str):
        return "text", label
    if isinstance(label, dict):
        unknown = set(label) - {"boxes", "categories"}
        if "boxes" not in label or unknown:
            raise InputError(f"{where}: a box label is {{\"boxes\": [[x, y, w, h], ...], \"categories\": [...]}}"
                             + (f"; unknown key {sorted(unknown)[0]!r}" if unknown else "; \"boxes\" is missing"))
        try:
            boxes = np.asarray(label["boxes"], np.float64).reshape(-1, 4)
            cats = np.asarray(label.get("categories", [0] * len(boxes)), np.int64).reshape(-1)
        except (ValueError, TypeError) as exc:
            raise InputError(f"{where}: box label: {exc}") from None
        if len(cats) != len(boxes) or not np.isfinite(boxes).all() or (boxes[:, 2:] < 0).any():
            raise InputError(f"{where}: box label: {len(boxes)} boxes need as many categories, finite "
                             "coordinates and widths and heights not negative")
        return "boxes", (boxes, cats)
    return "number", label


def collect(kind: str, values: list):
    """A loader's labels of one kind as the data holds them."""
    if kind == "text":
        return np.array(values, dtype=str)
    if kind == "boxes":
        return BoxLabels(tuple(b for b, _ in values), tuple(c for _, c in values))
    return np.stack(values)
