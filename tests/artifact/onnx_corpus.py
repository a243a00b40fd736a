"""ONNX's own backend test models as a corpus no one here wrote: every node test case generated from the
installed onnx wheel's `onnx.backend.test.case.node` code, and every model the wheel ships under
`onnx/backend/test/data`. Used by tests/artifact/test_onnx_corpus.py and bench/bench_onnx_corpus.py.

`judge(paths)` inspects each file as `tiergate inspect` does and asks onnxruntime itself whether it creates a
session for it, then sorts the outcomes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path


def write_corpus(folder: Path) -> list[Path]:
    """Every node test case's model and every shipped model, written under `folder` (sorted by name)."""
    import onnx
    import onnx.backend.test as backend_test
    from onnx.backend.test.case.node import collect_testcases

    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    for case in cases:
        onnx.save(case.model, str(folder / f"node-{case.name}.onnx"))
    data = Path(backend_test.__file__).parent / "data"
    for model in sorted(data.rglob("*.onnx")):
        name = "-".join(model.relative_to(data).with_suffix("").parts)
        (folder / f"shipped-{name}.onnx").write_bytes(model.read_bytes())
    return sorted(folder.glob("*.onnx"))


def runtime_refusal(path: Path) -> str | None:
    """onnxruntime's message when it refuses to create a session (plain options, CPU EP), else None."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - the refusal is the answer
        return " ".join(str(exc).split())[:300]
    return None


@dataclass
class Outcomes:
    total: int = 0
    loads: int = 0                                       # onnxruntime creates a session
    refused: int = 0                                     # onnxruntime refuses
    internal: list[str] = field(default_factory=list)    # tiergate crashed (not a TiergateError)
    unusable: list[str] = field(default_factory=list)    # exit 2: tiergate's own one-line refusal
    refused_but_ok: list[str] = field(default_factory=list)
    loads_but_error: list[str] = field(default_factory=list)
    refused_and_error: int = 0
    loads_and_ok: int = 0

    def line(self) -> str:
        return (f"{self.total} models: onnxruntime loads {self.loads}, refuses {self.refused}; tiergate: "
                f"{len(self.internal)} internal errors, {len(self.unusable)} unusable (exit 2), "
                f"{len(self.refused_but_ok)} refused but ok, {len(self.loads_but_error)} loadable with an error "
                f"finding; {self.refused_and_error} refused and flagged, {self.loads_and_ok} loadable and ok")


def judge(paths: list[Path]) -> Outcomes:
    from tiergate.artifact import load_artifact
    from tiergate.cli.intake import inspect_one
    from tiergate.diff import diff_artifacts

    out, previous = Outcomes(), None
    for path in paths:
        out.total += 1
        refusal = runtime_refusal(path)
        out.loads += refusal is None
        out.refused += refusal is not None
        try:
            report, _ = inspect_one(path)
            if "error" not in report:          # diff against the model before it (different models)
                artifact = load_artifact(path)
                if previous is not None:
                    diff_artifacts(previous, artifact).to_json()
                previous = artifact
        except Exception as exc:  # noqa: BLE001 - a crash is what this counts
            out.internal.append(f"{path.name}: {type(exc).__name__}: {exc}")
            continue
        errors = [f["message"] for f in report.get("findings", []) if f["severity"] == "error"]
        if "error" in report:
            out.unusable.append(f"{path.name}: {report['error']}")
        elif refusal is not None and report["ok"]:
            out.refused_but_ok.append(f"{path.name}: {refusal}")
        elif refusal is None and errors:
            out.loads_but_error.append(f"{path.name}: {errors[0]}")
        elif refusal is not None:
            out.refused_and_error += 1
        else:
            out.loads_and_ok += 1
    return out
