"""`tiergate explain --fix`: candidates that fix a quantized ONNX model, made from its FP32 reference by
onnxruntime's quantizer (orchestrator/explain_ab.py) and gated, every one, through the one gate path
(orchestrator.gate) against the FP32 reference on the request's tiers with the INT8 candidate as incumbent (A/B):

1. recalibrated INT8: the reference quantized with the candidate's own settings, calibrated on the calibration
   data by percentile (99.99, 99.999), entropy and min-max;
2. the minimal float set: the reference quantized with the candidate's own settings and activation ranges (its
   defect kept), the suspect layers of the explanation (per tier, merged by rank) returned to float one Q/DQ pair
   at a time: the shortest passing prefix of that list, found by doubling then bisection on the gate's verdicts;
3. both (the best recalibration with the float set searched again) when neither alone passes.

Gates are what costs: the FP32 reference's and the incumbent's runs come from the run cache after the first
gate (run keys name the artifact's content hash, never its path), a candidate whose bytes were gated already is
not gated again, and each candidate is gated on the native tiers first: the emulated ones only when those pass
(a rejection there settles it), and a recalibration only when no other recalibration (as small) passes on every
tier already. `--mixed-precision` is (2) alone.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from tiergate import explain as core
from tiergate.decision import INCONCLUSIVE, PROMOTE, REJECT
from tiergate.execution.explain import eval_data
from tiergate.explain import fixes as fx
from tiergate.explain.recipe import prepared
from tiergate.orchestrator.explain_ab import (artifact_size, candidate_ranges, host_sqnr, quant_settings,
                                              require_onnx, requantize)
from tiergate.orchestrator.seams import Seams
from tiergate.orchestrator.sequence import gate
from tiergate.orchestrator.types import say
from tiergate.request import GateRequest, RunOptions, source_file

# name, calibration method, percentile, how the table says it
RECALIBRATIONS = (("percentile-99.99", "percentile", 99.99, "percentile 99.99"),
                  ("percentile-99.999", "percentile", 99.999, "percentile 99.999"),
                  ("entropy", "entropy", None, "entropy"),
                  ("minmax", "minmax", None, "min-max"))
FLOAT_SET = "float-set"
OWN_RANGES = "the candidate's own ranges"


def fix_files(out_dir: Path) -> list[Path]:
    """Every file --fix may write into OUT_DIR, named by method."""
    names = [f"recal-{name}.onnx" for name, *_ in RECALIBRATIONS] + [f"{FLOAT_SET}.onnx"]
    names += [f"recal-{name}+{FLOAT_SET}.onnx" for name, *_ in RECALIBRATIONS]
    return [Path(out_dir) / name for name in names]


def check_fix(candidate: Path, reference: Path, out_dir: Path, inputs: list[tuple[str, Path | None]] = (), *,
              outside_home: bool = True) -> None:
    """What --fix needs, checked before any work starts: ONNX artifacts, and OUT_DIR a folder (made when missing)
    none of whose files is an input or lies inside the home (paths.check_outputs, exit 2)."""
    from tiergate.artifact.files import artifact_parts
    from tiergate.paths import check_outputs

    require_onnx("--fix", candidate, reference)
    check_outputs([("--fix", path) for path in fix_files(out_dir)], list(inputs),
                  artifacts=[("candidate", candidate), ("reference", reference)], parts=artifact_parts,
                  folders=[("--fix", Path(out_dir))], outside_home=outside_home)


def find_fixes(result: core.Explanation, request: GateRequest, calibration: Path, out_dir: Path,
               seams: Seams | None = None, options: RunOptions | None = None, *,
               recalibrations=RECALIBRATIONS, float_set: bool = True) -> fx.FixReport:
    """Make, gate and order the candidates (module docstring); the models go to `out_dir`, named by method.
    `recalibrations` (a subset of RECALIBRATIONS) and `float_set` choose what is tried: --mixed-precision is the
    float set alone."""
    options = options or RunOptions()
    candidate, reference = Path(request.candidate), Path(request.reference)
    check_fix(candidate, reference, Path(out_dir),
              [("evaluation data", source_file(request.data)), ("calibration data", Path(calibration)),
               ("incumbent", request.incumbent)], outside_home=False)   # the CLI checked the home
    with tempfile.TemporaryDirectory(prefix="tiergate-fix-") as tmp:
        return _Fixer(result, request, Path(calibration), Path(out_dir), seams, options, Path(tmp)).run(
            list(recalibrations), float_set)


class _Fixer:
    def __init__(self, result, request: GateRequest, calibration: Path, out_dir: Path, seams, options: RunOptions,
                 work: Path):
        from tiergate.artifact import load_artifact

        self.result, self.request, self.calibration, self.out = result, request, calibration, out_dir
        self.seams, self.options, self.work = seams, options, work
        self.candidate, self.reference = Path(request.candidate), Path(request.reference)
        self.data = eval_data(request.data, load_artifact(self.reference).inputs).path
        self.gates_run = 0
        self.seen: dict[str, fx.Fix] = {}        # content hash -> its gate (the same bytes are not gated twice)
        self.notes: list[str] = []

    def say(self, text: str) -> None:
        say(self.options.progress, text)

    # -- the whole answer ------------------------------------------------------------------------
    def run(self, recalibrations: list, float_set: bool) -> fx.FixReport:
        import onnx

        self.out.mkdir(parents=True, exist_ok=True)
        if self.calibration.resolve() == Path(self.data).resolve():
            self.say("calibrating on the evaluation data, as asked (its accuracy figures are then optimistic)")
        settings = quant_settings(self.candidate, self.reference)
        self.settings = settings
        if settings["pre_process"]:
            self.say("pre-processing the reference as the candidate was (quant_pre_process)")
        self.base = prepared(self.reference, settings, self.work / "reference-prepared.onnx")
        base_names = {n.name for n in onnx.load(str(self.base)).graph.node if n.name}
        graph = onnx.load(str(self.candidate)).graph
        outputs = {o.name for o in onnx.load(str(self.reference)).graph.output}
        ranked = fx.merge_ranked([core.worst_layers(item.layers, item.threshold_db, outputs)
                                  for item in self.result.targets.values() if not item.error])

        def nodes_of(layer) -> list[str]:
            # the candidate's nodes where the reference has them (a QDQ candidate by onnxruntime keeps its names),
            # and the layer's nodes as named in the reference (the pairing's fp32_nodes: a QOperator candidate's
            # QLinearConv is the reference's Conv)
            names = fx.layer_nodes(graph, layer) + list(layer.fp32_nodes)
            return [n for n in dict.fromkeys(names) if n in base_names]

        steps, left_out = fx.float_steps(ranked, nodes_of)
        report = fx.FixReport(str(self.calibration), settings, self._int8(), ranked_layers=[x.tensor for x in ranked],
                              left_out=left_out)
        if report.candidate.passes:
            self.notes.append("the INT8 candidate passes on every tier: nothing to fix")
        else:
            fixes: list[fx.Fix | None] = []
            for item in recalibrations:
                # emulated gates are the dear ones: once a recalibration passes on every tier, the others (no
                # layer in float either: as small) are gated on the native tiers only
                settled = next((f for f in fixes if f is not None and f.passes), None)
                fixes.append(self._recalibrated(*item, settled=settled))
            if float_set:
                fixes.append(self._float_set(steps))
            if float_set and recalibrations and steps and not any(f is not None and f.passes for f in fixes):
                fixes.append(self._both(steps, [f for f in fixes if f is not None and f.method == fx.RECALIBRATED]))
            report.fixes = fx.order_fixes([f for f in fixes if f is not None])
        if float_set and not steps:
            self.notes.append("no suspect layer of the explanation has a node to return to float")
        report.gates_run, report.notes = self.gates_run, self.notes
        return report

    def _int8(self) -> fx.Fix:
        self.say("gating the INT8 candidate")
        return self._gate(self.candidate, "int8", fx.CANDIDATE, "as given", [], incumbent=None)

    def _recalibrated(self, name: str, method: str, percentile, label: str, *,
                      settled: fx.Fix | None = None) -> fx.Fix | None:
        """A recalibrated INT8; None when its bytes are an earlier fix's (named in that fix's `same_as`: onnxruntime's
        entropy calibrator, at quantize_static's 128 histogram bins, keeps each tensor's whole range, as min-max)."""
        path = self.out / f"recal-{name}.onnx"
        self.say(f"re-quantizing the reference, {label} calibration")
        requantize(self.base, path, self.calibration, self.settings, [], method=method, percentile=percentile)
        same = self.seen.get(_sha(path))
        if same is not None:
            self.say(f"recal-{name} is the same model as {same.name}: not gated again")
            same.same_as.append(f"recal-{name}")
            return None
        return self._gate(path, f"recal-{name}", fx.RECALIBRATED, label, [], settled=settled)

    def _float_set(self, steps: list[fx.FloatLayer]) -> fx.Fix | None:
        """(2): the candidate's own ranges kept, the shortest passing prefix of the steps in float."""
        if not steps:
            return None
        overrides, missed = candidate_ranges(self.candidate, self.base)
        label = OWN_RANGES
        if missed:
            label += f" ({len(overrides)} tensors; {len(missed)} without a reference tensor, calibrated)"
            self.notes.append(f"float set: {len(missed)} of the candidate's quantized tensors have no tensor of the "
                              f"reference to keep their range on (calibrated on the calibration data instead): "
                              f"{', '.join(missed[:8])}{' ...' if len(missed) > 8 else ''}")
        remade = requantize(self.base, self.work / "own-ranges-0.onnx", self.calibration, self.settings, [],
                            overrides=overrides)
        fidelity = host_sqnr(remade, self.candidate, Path(self.data), samples=16)
        self.notes.append(f"float set: the candidate re-made from the reference with its own ranges and no layer in "
                          f"float matches it at {fidelity:.1f} dB end to end (this host, 16 samples)")

        def make(prefix: list[fx.FloatLayer], path: Path) -> Path:
            return requantize(self.base, path, self.calibration, self.settings, fx.nodes_of(prefix),
                              overrides=overrides)
        return self._search(steps, FLOAT_SET, fx.FLOAT_SET, label, make)

    def _both(self, steps: list[fx.FloatLayer], recalibrated: list[fx.Fix]) -> fx.Fix | None:
        """(3): the best recalibration (most tiers passing, then the highest worst interval) with a float set."""
        if not recalibrated:
            return None
        best = max(recalibrated, key=_score)
        name, method, percentile, label = next(r for r in RECALIBRATIONS if f"recal-{r[0]}" == best.name)

        def make(prefix: list[fx.FloatLayer], path: Path) -> Path:
            return requantize(self.base, path, self.calibration, self.settings, fx.nodes_of(prefix), method=method,
                              percentile=percentile)
        return self._search(steps, f"recal-{name}+{FLOAT_SET}", fx.BOTH, label, make)

    # -- the search ------------------------------------------------------------------------------
    def _search(self, steps: list[fx.FloatLayer], name: str, method: str, label: str,
                make: Callable[[list[fx.FloatLayer], Path], Path]) -> fx.Fix:
        tried: dict[int, fx.Fix] = {}

        def passes(k: int) -> bool:
            self.say(f"{name}: {k} of {_count(len(steps), 'suspect layer')} in float")
            path = make(steps[:k], self.work / f"{name}-{k}.onnx")
            tried[k] = self._gate(path, name, method, label, steps[:k])
            return tried[k].passes

        search = fx.shortest_passing_prefix(len(steps), passes)
        k = search.found if search.found is not None else max(tried)
        fix = tried[k]
        path = self.out / f"{name}.onnx"
        shutil.copyfile(fix.path, path)
        trail = [{"layers": n, "tensors": [s.tensor for s in steps[:n]], "passed": ok} for n, ok in search.tried]
        layers, gates = _count(len(steps), "suspect layer"), _count(search.gates, "gate")
        note = (f"the shortest passing prefix of {layers} ({k} in float), found in {gates}" if search.found
                else f"not even all {layers} in float pass ({gates})")
        return dataclasses.replace(fix, path=str(path), gates=search.gates, trail=trail, note=note)

    # -- one candidate through the one gate path -------------------------------------------------
    def _gate(self, path: Path, name: str, method: str, label: str, layers: list[fx.FloatLayer], *,
              incumbent: Path | None | str = "int8", settled: fx.Fix | None = None) -> fx.Fix:
        """Gate `path` on the native tiers, then (when those pass) on the emulated ones; with `settled` (a fix as
        small that passes on every tier already) the emulated ones are not gated."""
        incumbent = self.candidate if incumbent == "int8" else incumbent
        key = _sha(path)
        if key in self.seen:
            same = self.seen[key]
            return dataclasses.replace(same, name=name, method=method, path=str(path), calibration=label,
                                       float_layers=list(layers), gates=0,
                                       note=f"the same model as {same.name} (its gate reused)")
        classes = list(self.request.device_classes)
        stages = [s for s in ([dc for dc in classes if not dc.emulated], [dc for dc in classes if dc.emulated]) if s]
        fix = fx.Fix(name, method, str(path), label, False, PROMOTE, size_bytes=artifact_size(path),
                     float_layers=list(layers))
        for i, stage in enumerate(stages):
            request = dataclasses.replace(self.request, candidate=Path(path), incumbent=incumbent,
                                          device_classes=tuple(stage))
            run = gate(request, self.seams, self.options)
            self.gates_run += 1
            names = [dc.name for dc in stage]
            fix.tiers.update(fx.tier_verdicts(run.decision, names))
            fix.reasons += list(run.decision.reasons)
            fix.ab.update({f"{c.device_class}/{c.name}": {"value": c.value, "threshold": c.threshold,
                                                          "passed": c.passed, "detail": c.detail}
                           for c in run.decision.checks if c.name.startswith("noninferior")})
            if run.decision.verdict != PROMOTE:
                fix.verdict = REJECT if REJECT in (fix.verdict, run.decision.verdict) else INCONCLUSIVE
            failed = not all(fix.tiers.get(n) is not None and fix.tiers[n].verdict == fx.PASS for n in names)
            if failed or settled is not None:
                why = (f"not gated: it fails on {', '.join(names)} already" if failed else
                       f"not gated: {settled.name}, as small, passes on every tier already")
                for later in stages[i + 1:]:
                    for dc in later:
                        fix.tiers[dc.name] = fx.TierVerdict(fx.NOT_GATED, emulated=dc.emulated, reasons=[why])
                break
        fix.passes = bool(fix.tiers) and all(t.verdict == fx.PASS for t in fix.tiers.values())
        self.seen[key] = fix
        return fix


def _sha(path: Path) -> str:
    from tiergate.hashing import file_sha256

    return file_sha256(path)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _score(fix: fx.Fix) -> tuple:
    passed = sum(t.verdict == fx.PASS for t in fix.tiers.values())
    lows = [t.low for t in fix.tiers.values() if t.low is not None]
    return passed, min(lows) if lows else float("-inf")


def mixed_precision_ab(result: core.Explanation, request: GateRequest, calibration: Path, out: Path,
                       seams: Seams | None = None, options: RunOptions | None = None,
                       report: fx.FixReport | None = None) -> dict:
    """--mixed-precision OUT: the float set alone (2), written to `out`, in the shape "mixed_precision" has always
    had: the INT8 candidate and the mixed one side by side (verdicts, whether each passes against the FP32
    reference alone, the A/B checks, sizes, latency on real tiers) and the search's trail. `report`: a --fix
    answer already made (its float set is reused, nothing is gated again)."""
    from tiergate.orchestrator.explain_ab import check_mixed_precision

    candidate, reference = Path(request.candidate), Path(request.reference)
    check_mixed_precision(candidate, reference, Path(out),
                          [("evaluation data", source_file(request.data)), ("calibration data", Path(calibration)),
                           ("incumbent", request.incumbent)], outside_home=False)   # the CLI checked the home
    if report is None:
        with tempfile.TemporaryDirectory(prefix="tiergate-mixed-") as folder:
            report = find_fixes(result, request, calibration, Path(folder), seams, options, recalibrations=())
            mixed = next((f for f in report.fixes if f.method == fx.FLOAT_SET), None)
            if mixed is not None:
                Path(out).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(mixed.path, out)
    else:
        mixed = next((f for f in report.fixes if f.method == fx.FLOAT_SET), None)
        if mixed is not None:
            shutil.copyfile(mixed.path, out)
    doc = {"settings": report.settings, "trail": [], "gates": 0, "int8": _side(report.candidate), "mixed": None}
    if mixed is None:
        doc["note"] = ("the INT8 candidate passes on every tier: nothing to keep in float" if report.candidate.passes
                       else "no suspect layer of the explanation has a node to keep in float")
        return doc
    mixed = dataclasses.replace(mixed, path=str(out))
    return doc | {"trail": mixed.trail, "gates": mixed.gates, "mixed": _side(mixed)}


def _side(fix: fx.Fix) -> dict:
    return {"path": fix.path, "verdict": fix.verdict, "reasons": list(fix.reasons), "passes_against_reference":
            fix.passes, "ab": dict(fix.ab), "size_bytes": fix.size_bytes, "latency_ms": fix.latency_ms(),
            "excluded": fix.float_nodes, "tiers": {name: t.verdict for name, t in fix.tiers.items()}}
