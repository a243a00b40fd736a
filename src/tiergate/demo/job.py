"""The main job on the embedded default: real digits model, realistic candidates, every tier, a verdict.

`run_demo` builds (or reuses) the demo set, registers every candidate with its
FP32 reference, gates each one on the device classes of its format (native x86
and emulated arm64), records the decisions, and writes the drift report. The
FP32 reference's runs are shared by all candidates of a format (the run cache).
A candidate gated after another of its format and precision was promoted is
A/B-tested against the latest such incumbent (like with like: a precision change is judged
against the FP32 reference, since e.g. INT8 XNNPACK kernels can be slower than
FP16-as-FP32 ones on x86 and the A/B latency check would rightly object).

The entropy-calibrated INT8 candidate differs from FP32 on one of the 450 test images: its
accuracy-ratio interval straddles the 0.99 threshold, so the gate says INCONCLUSIVE with the
samples it would need at the observed effect. The demo then takes that advice: the same
candidate, on x86 only, gated on a larger set (the test split plus jittered copies of it) is
decided. That confirmation is not recorded in the registry (its aliases and the drift report
follow the one evaluation set every candidate was judged on).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tiergate import orchestrator
from tiergate.demo import data
from tiergate.demo.models import Candidate, DemoSet, build_demo_set
from tiergate.gate import Decision
from tiergate.hashing import file_sha256
from tiergate.paths import home
from tiergate.policy import load_policy
from tiergate.request import GateRequest, RunOptions
from tiergate.targets import resolve

MODEL = "digits-cnn"
TARGETS = {
    "onnx": ["x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"],
    "tflite": ["x86_64-cpu-tflite", "arm64-cpu-tflite"],
}
# The confirmation on more samples: (candidate, its targets, samples, the verdict it should get).
CONFIRM = ("onnx-int8-entropy", ["x86_64-cpu-onnxruntime"], 2000, "promote")
CONFIRM_NPZ = "digits-eval-{n}.npz"


@dataclass
class CandidateOutcome:
    candidate: Candidate
    decision: Decision
    incumbent: str | None
    cache_hits: int
    containers_started: int
    expected: str = ""          # "promote", "reject" or "inconclusive" (default: the candidate's)
    data_note: str = ""         # set when gated on other data than the full evaluation set
    decision_id: int | None = None   # its decision in the registry (None: not recorded)

    @property
    def got_expected(self) -> bool:
        return self.decision.verdict.lower() == (self.expected or self.candidate.expected)


@dataclass
class DemoOutcome:
    demo: DemoSet
    outcomes: list[CandidateOutcome] = field(default_factory=list)
    report_html: Path | None = None
    report_json: Path | None = None
    explain_html: Path | None = None          # the badly calibrated candidate: which layer, the fixes gated
    explained: object | None = None           # its tiergate.explain.Explanation
    explain_seconds: float = 0.0              # what explaining it and gating its fixes added to the demo

    @property
    def as_expected(self) -> bool:
        return bool(self.outcomes) and all(o.got_expected for o in self.outcomes)


def run_demo(work_dir: Path | None = None, *, targets: dict[str, list[str]] | None = None,
             progress: Callable[[str], None] | None = None,
             on_candidate: Callable[[Candidate], None] | None = None, max_parallel: int = 2,
             on_first: Callable[[Candidate, Decision], None] | None = None) -> DemoOutcome:
    """The demo. With emulated tiers among `targets`, every candidate is first gated on the native tiers alone
    (`on_first` gets each such verdict: minutes after starting, while the emulated tiers' setup may still go on in
    the background), then, once emulation answers (doctor.wait_for_emulation), on every tier: the recorded decisions,
    the native runs reused from the run cache."""
    from tiergate.doctor import wait_for_emulation
    from tiergate.registry import Registry

    work_dir = Path(work_dir or home() / "demo")
    say = progress or (lambda _text: None)
    say("training the digits CNN and exporting candidates (cached after the first run)")
    demo = build_demo_set(work_dir / "models")
    registry = Registry()
    policy = load_policy(None)
    outcome = DemoOutcome(demo)
    targets = targets or TARGETS
    native = {fmt: [n for n in names if not resolve([n])[0].emulated] for fmt, names in targets.items()}
    if native != targets:
        for candidate in demo.candidates:
            if native[candidate.format]:
                first = _first_verdict(demo, candidate, native, policy, say, max_parallel)
                if on_first:
                    on_first(candidate, first)
        wait_for_emulation(say)
    for candidate in demo.candidates:
        if on_candidate:
            on_candidate(candidate)
        outcome.outcomes.append(_gate_one(registry, demo, candidate, targets, policy, say, max_parallel))
    outcome.outcomes.append(_confirm(demo, work_dir, policy, say, max_parallel, on_candidate))
    _explain_badcal(outcome, demo, targets, policy, work_dir, say, registry)
    say("writing the drift report")
    outcome.report_html, outcome.report_json = _report(registry, work_dir / "report")
    return outcome


BADCAL = "onnx-int8-badcal"
EXPLAIN_SAMPLES = 16       # tensors dumped per tier: enough to locate the layer, cheap under emulation


def _explain_badcal(outcome: DemoOutcome, demo: DemoSet, targets, policy, work_dir: Path, say,
                    registry=None) -> None:
    """The seed's fix, in one step: which layer lost it on each tier, and the candidates that fix it (explain
    --fix: the reference recalibrated on the training-split calibration images, the minimal float set, both),
    each gated A/B against the INT8 candidate on CONFIRM's larger evaluation set, smallest first. The explanation is recorded in the registry with
    the candidate's decision: the drift report links its verdict cell to it."""
    import numpy as np

    from tiergate.demo import data
    from tiergate.errors import TiergateError
    from tiergate.execution.explain import explain
    from tiergate.orchestrator.explain_ab import docker_runner
    from tiergate.orchestrator.explain_fix import find_fixes
    from tiergate.explain import markdown_table
    from tiergate.reports.explain_html import write_html

    if BADCAL not in {c.name for c in demo.candidates}:
        return
    candidate = demo.candidate(BADCAL)
    device_classes = resolve(targets["onnx"])
    folder = work_dir / "report" / "explain"
    folder.mkdir(parents=True, exist_ok=True)
    calibration = folder / "calibration.npz"
    np.savez(calibration, **{data.INPUT_NAME: data.calibration_images(256, demo.seed)})
    say(f"{BADCAL}: explaining (which layer, on which tier) and gating the candidates that fix it")
    t0 = time.monotonic()
    try:
        progress = lambda text: say(f"{BADCAL}: {text}")   # noqa: E731
        result = explain(candidate.path, demo.reference_onnx, demo.eval_data, device_classes, policy,
                         runner=docker_runner(), samples=EXPLAIN_SAMPLES, progress=progress)
        # the fixes are gated on CONFIRM's larger set: 450 samples cannot show a recalibrated INT8 within 0.99 of
        # FP32 (its interval straddles the threshold, as the entropy INT8's does); the dumps above use the test split
        larger = _eval_set(work_dir / "models" / CONFIRM_NPZ.format(n=CONFIRM[2]), CONFIRM[2])
        request = GateRequest(candidate.path, demo.reference_onnx, str(larger), tuple(device_classes), policy)
        result.fixes = find_fixes(result, request, calibration, folder / "fixes",
                                  options=RunOptions(progress=progress)).to_json()
    except TiergateError as exc:     # the demo's verdicts stand; say why the explanation is missing
        say(f"{BADCAL}: explain failed: {exc.one_line()}")
        return
    (folder / "explain.json").write_text(result.dumps())
    (folder / "explain.md").write_text(markdown_table(result))
    outcome.explain_html = write_html(result, folder / "explain.html")
    outcome.explained = result
    outcome.explain_seconds = time.monotonic() - t0
    gated = next((o for o in outcome.outcomes if o.candidate.name == BADCAL and o.decision_id is not None), None)
    if registry is not None and gated is not None:
        registry.record_explanation(gated.decision_id, result.to_json())


def _first_verdict(demo: DemoSet, candidate: Candidate, native, policy, say, max_parallel) -> Decision:
    """The candidate on its format's native tiers alone, against FP32 (not recorded: the registry holds the gate on
    every tier; its native runs are reused from the run cache there)."""
    reference = demo.reference_onnx if candidate.format == "onnx" else demo.reference_tflite
    device_classes = resolve(native[candidate.format])
    say(f"{candidate.name}: first verdict on {', '.join(dc.name for dc in device_classes)}")
    request = GateRequest(candidate.path, reference, str(demo.eval_data), tuple(device_classes), policy)
    options = RunOptions(max_parallel=max_parallel, progress=lambda text: say(f"{candidate.name}: {text}"))
    return orchestrator.gate(request, orchestrator.Seams(), options).decision


def _gate_one(registry, demo: DemoSet, candidate: Candidate, targets, policy, say, max_parallel) -> CandidateOutcome:
    from tiergate.registry import register_artifact

    reference = demo.reference_onnx if candidate.format == "onnx" else demo.reference_tflite
    device_classes = resolve(targets[candidate.format])
    register_artifact(registry, candidate.path, model=MODEL, reference=reference,
                      tags={"demo": candidate.name, "precision": candidate.precision})
    incumbent, incumbent_name = _incumbent(registry, candidate, device_classes) or (None, None)
    say(f"{candidate.name}: gating on {', '.join(dc.name for dc in device_classes)}")
    request = GateRequest(candidate.path, reference, str(demo.eval_data), tuple(device_classes), policy,
                          incumbent=incumbent)
    options = RunOptions(registry=registry, records=True, max_parallel=max_parallel,
                         progress=lambda text: say(f"{candidate.name}: {text}"))
    run = orchestrator.gate(request, orchestrator.Seams(), options)
    recorded, _ = orchestrator.record_or_reuse(registry, run, cost_tags={"demo": candidate.name})
    return CandidateOutcome(candidate, run.decision, incumbent_name,
                            run.cache_hits, run.containers_started, decision_id=recorded.id)


def _confirm(demo: DemoSet, work_dir: Path, policy, say, max_parallel, on_candidate) -> CandidateOutcome:
    """CONFIRM's candidate gated on a larger evaluation set, on x86 only (not recorded in the registry)."""
    name, target_names, n, expected = CONFIRM
    candidate = demo.candidate(name)
    if on_candidate:
        on_candidate(candidate)
    larger = _eval_set(work_dir / "models" / CONFIRM_NPZ.format(n=n), n)
    note = f"{n:,} samples (test split + jittered copies)"
    say(f"{name}: gating on {note} ({', '.join(target_names)})")
    request = GateRequest(candidate.path, demo.reference_onnx, str(larger), tuple(resolve(target_names)), policy)
    options = RunOptions(max_parallel=max_parallel, progress=lambda text: say(f"{name} ({n} samples): {text}"))
    run = orchestrator.gate(request, orchestrator.Seams(), options)
    return CandidateOutcome(candidate, run.decision, None, run.cache_hits, run.containers_started,
                            expected=expected, data_note=note)


def _eval_set(path: Path, n: int) -> Path:
    """make_eval_npz(path, n), keeping an existing equal file (.npz bytes carry a write time: the hash,
    and with it the run cache, must hold across demo runs)."""
    images, labels = data.jittered_test_set(n, seed=0)
    try:
        with np.load(path) as old:
            if np.array_equal(old[data.INPUT_NAME], images) and np.array_equal(old[data.LABELS], labels):
                return path
    except (OSError, ValueError, KeyError):
        pass
    return data.write_eval_npz(path, images, labels)


def _incumbent(registry, candidate: Candidate, device_classes) -> tuple[Path, str] | None:
    """The latest artifact promoted on the first tier with the candidate's format and precision.

    Read from the alias history rather than the current alias, so that an unchanged
    re-run of the demo picks the same incumbent (and reuses every run and decision).
    """
    sha = file_sha256(candidate.path)  # the demo's artifacts are single files: their artifact sha
    for move in reversed(registry.alias_history(MODEL, device_classes[0].tier)):
        record = registry.artifact(move.artifact_sha)
        if record.sha256 != sha and (record.format, record.precision) == (candidate.format, candidate.precision):
            path = registry.fetch_artifact(record.sha256, home() / "incumbents" / record.short)
            return path, record.tags.get("demo", record.short)
    return None


def _report(registry, out_dir: Path) -> tuple[Path, Path]:
    from tiergate.registry.report_data import build_drift_report
    from tiergate.reports.html import write_report

    return write_report(build_drift_report(registry, MODEL), out_dir)
