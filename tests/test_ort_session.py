"""In-process onnxruntime sessions are made one at a time (ort_session): construction is not thread-safe."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np

import modelkit
from tiergate import ort_session

SRC = Path(ort_session.__file__).parent


def test_every_in_process_session_in_the_package_is_made_through_the_lock():
    made_elsewhere = [f"{path.relative_to(SRC)}:{n}" for path in SRC.rglob("*.py") if path.name != "ort_session.py"
                      for n, line in enumerate(path.read_text().splitlines(), 1)
                      if re.search(r"\bInferenceSession\(", line)]
    assert made_elsewhere == []


def test_the_lock_is_held_while_a_session_is_made_and_free_after(tmp_path):
    seen = []
    model = modelkit.save(modelkit.mlp(), "mlp.onnx", tmp_path)
    with ort_session.LOCK:          # a session asked for while another is being made waits for it
        waiter = threading.Thread(target=lambda: seen.append(ort_session.session(str(model))))
        waiter.start()
        waiter.join(timeout=1.0)
        assert waiter.is_alive()
    waiter.join(timeout=60)
    assert not waiter.is_alive() and not ort_session.LOCK.locked()
    session = seen[-1]
    x = np.ones((2, 8), np.float32)
    (a,) = session.run(None, {session.get_inputs()[0].name: x})
    assert a.shape == (2, 4)


def test_sessions_made_from_many_threads_at_once_all_load_and_agree(tmp_path):
    model = modelkit.save(modelkit.mlp(), "mlp.onnx", tmp_path)
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    outs, errors = [], []

    def one():
        try:
            s = ort_session.session(str(model))
            outs.append(s.run(None, {s.get_inputs()[0].name: x})[0])
        except Exception as exc:  # noqa: BLE001 - the assertion below names it
            errors.append(repr(exc))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and len(outs) == 8
    assert all(np.array_equal(o, outs[0]) for o in outs)
