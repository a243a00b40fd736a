"""Labels that are not one number per sample (tiergate.labels): texts and COCO-style boxes, in the archive, in a
side file the archive names, or from a loader; validated with one-line errors; carried by content into the
archives a gate makes (the decision's data hash covers them, an early decision's chunks hold their samples')."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tiergate.dataloader import run_loader
from tiergate.errors import InputError
from tiergate.evaldata import load_eval_data, normalised, sample_keys, select, validate_against
from tiergate.labels import BoxLabels
from tiergate.artifact.model import TensorSpec

SPECS = [TensorSpec("x", (None, 4), "float32")]


def _npz(tmp_path, labels, n=5, name="eval.npz"):
    path = tmp_path / name
    np.savez(path, x=np.arange(n * 4, dtype=np.float32).reshape(n, 4), labels=labels)
    return path


def _coco(tmp_path, images=5, annotations=None, name="boxes.json", **extra):
    doc = {"images": [{"id": 10 + i} for i in range(images)],
           "annotations": annotations if annotations is not None else
           [{"image_id": 10, "bbox": [1, 2, 3, 4], "category_id": 2}, {"image_id": 12, "bbox": [0, 0, 5, 5]}],
           **extra}
    (tmp_path / name).write_text(json.dumps(doc))
    return name


def test_texts_come_from_a_string_array_or_a_side_file(tmp_path):
    direct = load_eval_data(_npz(tmp_path, np.array(["a", "bb", "", "dd d", "é"])))
    assert direct.labels.dtype.kind == "U" and list(direct.labels) == ["a", "bb", "", "dd d", "é"]
    (tmp_path / "lines.txt").write_text("a\nbb\n\ndd d\né\n", encoding="utf-8")
    side = load_eval_data(_npz(tmp_path, np.array("lines.txt"), name="side.npz"))
    assert list(side.labels) == list(direct.labels) and side.labels_file.endswith("lines.txt")
    archived = normalised(side)                 # the texts come into a content-hashed archive
    assert archived.path != side.path and list(archived.labels) == list(direct.labels) and not archived.labels_file
    (tmp_path / "lines.txt").write_text("a\nbb\n\ndd d\nE\n", encoding="utf-8")
    assert normalised(load_eval_data(tmp_path / "side.npz")).sha256 != archived.sha256   # the texts are its content


def test_boxes_come_from_a_coco_side_file_in_sample_order(tmp_path):
    data = load_eval_data(_npz(tmp_path, np.array(_coco(tmp_path))))
    boxes = data.labels
    assert isinstance(boxes, BoxLabels) and len(boxes) == 5 and boxes.count == 2
    assert boxes.boxes[0].tolist() == [[1, 2, 3, 4]] and boxes.categories[0].tolist() == [2]
    assert boxes.boxes[2].tolist() == [[0, 0, 5, 5]] and boxes.categories[2].tolist() == [0]
    archived = normalised(data)
    assert isinstance(archived.labels, BoxLabels) and archived.labels.boxes[2].tolist() == [[0, 0, 5, 5]]
    chunk = select(archived, [2, 0])            # an early decision's chunk carries its own samples' boxes
    assert [b.tolist() for b in chunk.labels.boxes] == [[[0, 0, 5, 5]], [[1, 2, 3, 4]]]
    keys = sample_keys(archived, 0)
    other = BoxLabels(archived.labels.boxes[:2] + (np.array([[9.0, 9, 9, 9]]),) + archived.labels.boxes[3:],
                      archived.labels.categories)
    archived.labels = other
    assert (sample_keys(archived, 0)[2] != keys[2]).any() and (sample_keys(archived, 0)[1] == keys[1]).all()


@pytest.mark.parametrize("content, message", [
    (None, "does not exist or is not a regular file"),
    ("{not json", "not valid JSON"),
    ('{"annotations": []}', "must be a JSON object with an \"images\" list"),
    ('{"images": [{"id": 1}, {"id": 1}]}', "images\\[1\\] repeats id 1"),
    ('{"images": [{"name": "a"}]}', "images\\[0\\] must be an object with an integer or string \"id\""),
    ('{"images": [{"id": 1}], "annotations": [{"image_id": 2, "bbox": [0, 0, 1, 1]}]}', "names image_id 2"),
    ('{"images": [{"id": 1}], "annotations": [{"image_id": 1, "bbox": [0, 0, -1, 1]}]}', "\"bbox\" must be"),
    ('{"images": [{"id": 1}], "annotations": [{"image_id": 1, "bbox": [0, 0, 1]}]}', "\"bbox\" must be"),
    ('{"images": [{"id": 1}], "annotations": [{"image_id": 1, "bbox": [0, 0, 1, 1], "category_id": "a"}]}',
     "\"category_id\" must be an integer"),
])
def test_a_bad_box_file_is_one_line_naming_it(tmp_path, content, message):
    if content is not None:
        (tmp_path / "boxes.json").write_text(content)
    with pytest.raises(InputError, match=message) as err:
        load_eval_data(_npz(tmp_path, np.array("boxes.json")))
    assert "labels file 'boxes.json'" in str(err.value) and "\n" not in str(err.value)


def test_side_files_are_checked_against_the_samples(tmp_path):
    (tmp_path / "lines.txt").write_text("a\nb\n")
    with pytest.raises(InputError, match=r"2 labels but the inputs hold 5 samples"):
        load_eval_data(_npz(tmp_path, np.array("lines.txt")))
    with pytest.raises(InputError, match="must end in .txt"):
        load_eval_data(_npz(tmp_path, np.array("labels.csv")))
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="not UTF-8 text"):
        load_eval_data(_npz(tmp_path, np.array("bad.txt")))
    with pytest.raises(InputError, match="5 labels but the inputs hold 4 samples"):
        load_eval_data(_npz(tmp_path, np.array(_coco(tmp_path)), n=4))


LOADER = '''
import numpy as np

def texts():
    for i in range(4):
        yield {"x": np.full((1, 4), i, np.float32)}, f"line {i}"

def boxes():
    for i in range(4):
        yield {"x": np.full((1, 4), i, np.float32)}, {"boxes": [[i, i, 2, 2]] * i}

def mixed():
    yield {"x": np.zeros((1, 4), np.float32)}, "text"
    yield {"x": np.zeros((1, 4), np.float32)}, 3

def bad_box():
    yield {"x": np.zeros((1, 4), np.float32)}, {"boxes": [[0, 0, -2, 2]]}
'''


def test_a_loader_s_texts_and_boxes_are_labels(tmp_path, tiergate_home):
    loader = tmp_path / "loader.py"
    loader.write_text(LOADER)
    texts = run_loader(f"{loader}:texts", SPECS)
    assert list(texts.labels) == ["line 0", "line 1", "line 2", "line 3"]
    validate_against(texts, SPECS)
    boxes = run_loader(f"{loader}:boxes", SPECS)
    assert isinstance(boxes.labels, BoxLabels) and [len(b) for b in boxes.labels.boxes] == [0, 1, 2, 3]
    with pytest.raises(InputError, match="sample 1: its label is a number, earlier samples' are not"):
        run_loader(f"{loader}:mixed", SPECS)
    with pytest.raises(InputError, match="widths and heights not negative"):
        run_loader(f"{loader}:bad_box", SPECS)
