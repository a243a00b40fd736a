"""The demo model factory: a real digits classifier and realistic candidates.

`tiergate.demo.models.build_demo_set(out_dir)` trains a small CNN on
scikit-learn's digits (1,797 real 8x8 images, no download), exports the same
weights to ONNX and TFLite, quantizes them (good and broken calibration) and
writes an evaluation `.npz` from a held-out split. See docs/demo.md.

TensorFlow is an optional extra (`tiergate[tflite]`): it is imported only while
a set is being built, never when this package is imported.
"""

from tiergate.demo.models import Candidate, DemoSet, build_demo_set, make_eval_npz

__all__ = ["Candidate", "DemoSet", "build_demo_set", "make_eval_npz"]
