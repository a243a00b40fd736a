"""onnxruntime sessions made in this process, one at a time.

onnxruntime's InferenceSession construction is not thread-safe (microsoft/onnxruntime#27089: the
custom-op domains are registered process-wide while a session initializes). tiergate makes sessions in
threads: intake's load check per role (`lint.ort_coverage`), explain's checks, the tests' in-process
backend. A race there surfaces as a SystemError from the binding, which a load check would read as the
runtime refusing the model. Every in-process session is therefore made under `LOCK`; running a made
session needs no lock.
"""

from __future__ import annotations

import threading

LOCK = threading.Lock()


def session(model, options=None, providers=("CPUExecutionProvider",)):
    """`onnxruntime.InferenceSession(model, options, providers)`, made under the process-wide lock."""
    import onnxruntime as ort

    with LOCK:
        return ort.InferenceSession(model, sess_options=options, providers=list(providers))
