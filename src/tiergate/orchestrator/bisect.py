"""`tiergate bisect`: which optimizer passes (or which recipe options) make a check fail on one tier.

Every step is an ordinary gate through the one gate path (`orchestrator.gate`) on that tier alone: the candidate's
runs with a set of passes switched off (`GateRequest.disabled_passes`: onnxruntime's graph transformers by name,
`XNNPACK` for LiteRT's delegate, TVM's passes), cached like any run; the FP32 reference's and the incumbent's runs
come from the run cache after the first step. The check is the one `--check` names on that tier, else the first that
fails there. The passes searched are `--passes`, else those the tier's runtime reports changing the candidate's graph
(its describe: `runtime_graph.modified_by`), in the order they ran.

1. the first gate, nothing off: the check must fail (else there is nothing to bisect);
2. everything searched off: the check must pass (else no set of these passes is to blame: exit 1);
3. delta debugging (`tiergate.bisect.ddmin`) to a 1-minimal set whose removal makes it pass, the last passes
   first; then (unless `--first`) from the first pass, naming another minimal set where there is one.

With a recipe (`--recipe FILE.py:FUNCTION --good A.toml --bad B.toml`) the items are the options whose values
differ between the good and the bad configuration: step 1 is the bad configuration (it must fail), step 2 the good
one (it must pass), and ddmin finds a 1-minimal set of options whose bad values alone make it fail. The recipe is
called as FUNCTION(options: dict, output: str) and writes the candidate model to `output`.
"""

from __future__ import annotations

import dataclasses
import tempfile
import tomllib
from pathlib import Path

from tiergate import bisect as core
from tiergate.decision import Check, GateRun
from tiergate.errors import InputError
from tiergate.orchestrator.seams import Seams
from tiergate.orchestrator.types import say
from tiergate.request import GateRequest, RunOptions


def find_check(run: GateRun, target: str, label: str | None) -> Check:
    """The check bisected: `label` on `target`, else the first that fails there (InputError when none can be)."""
    checks = [c for c in run.decision.checks if c.device_class == target]
    if label:
        found = [c for c in checks if c.label == label or c.name == label]
        if not found:
            names = ", ".join(dict.fromkeys(c.label for c in checks)) or "none"
            raise InputError(f"--check {label}: no such check on {target} (its checks: {names})")
        return found[0]
    failing = [c for c in checks if not c.passed]
    decided = [c for c in failing if not c.inconclusive]
    if not (decided or failing):
        return checks[0] if checks else Check(target, "", "run", None, None, "==", True)
    return (decided or failing)[0]


def outcome(check: Check | None) -> str:
    if check is None:
        return core.FAIL
    return core.PASS if check.passed else (core.INCONCLUSIVE if check.inconclusive else core.FAIL)


class _Bisector:
    def __init__(self, request: GateRequest, target: str, label: str | None, seams: Seams | None,
                 options: RunOptions | None):
        classes = [dc for dc in request.device_classes if dc.name == target]
        if not classes:
            known = ", ".join(dc.name for dc in request.device_classes)
            raise InputError(f"--target {target}: not among the request's device classes ({known})")
        self.request = dataclasses.replace(request, device_classes=tuple(classes), early_stop=False)
        self.target, self.label = target, label
        self.seams, self.options = seams, options or RunOptions()
        self.steps: list[core.Step] = []
        self.check: Check | None = None

    def gate(self, applied: tuple[str, ...], **changes) -> tuple[core.Step, GateRun]:
        request = dataclasses.replace(self.request, **changes)
        say(self.options.progress, f"bisect step {len(self.steps) + 1}: {', '.join(applied) or 'nothing'}")
        from tiergate import orchestrator    # looked up per call: the package's gate, the one path

        run = orchestrator.gate(request, self.seams, self.options)
        if self.check is None:
            self.check = find_check(run, self.target, self.label)
            self.label = self.check.label
        found = [c for c in run.decision.checks if c.device_class == self.target and c.label == self.label]
        check = found[0] if found else None
        interval = check.interval if check is not None else None
        step = core.Step(list(applied), outcome(check), None if check is None else check.value,
                         None if interval is None else interval.low, None if interval is None else interval.high,
                         verdict=run.decision.verdict, reused=run.containers_started == 0)
        self.steps.append(step)
        return step, run

    def check_json(self, before: core.Step, after: core.Step | None) -> dict:
        c = self.check
        return {"label": c.label, "name": c.name, "output": c.output, "op": c.op, "threshold": c.threshold,
                "before": before.value, "after": None if after is None else after.value}


def bisect_passes(request: GateRequest, target: str, *, check: str | None = None, passes: list[str] | None = None,
                  seams: Seams | None = None, options: RunOptions | None = None,
                  alternatives: bool = True) -> core.Report:
    """The smallest set of optimizer passes whose removal makes the check pass on `target` (module docstring).
    The search starts from the last pass; `alternatives`: search again from the first one (about 2 log2(n) more gates
    at most), so that a second set that is enough alone (a pass earlier in the chain the failure also needs) is
    named too."""
    b = _Bisector(dataclasses.replace(request, disabled_passes=()), target, check, seams, options)
    first, run = b.gate(())
    if passes:
        _check_passes(passes, run, target)
    searched = list(dict.fromkeys(passes)) if passes else _passes_of(run, target)
    report = core.Report("passes", target, b.check_json(first, None), searched, steps=b.steps)
    if first.outcome == core.PASS:
        report.note = f"{b.check.label} passes on {target} with every pass on: nothing to bisect"
        return report
    if first.outcome == core.INCONCLUSIVE:
        report.status, report.note = core.UNDECIDED, (f"{b.check.label} is inconclusive on {target}: a bisection "
                                                      "needs a check that fails (more samples would decide it)")
        return report
    if not searched:
        report.status, report.note = core.NOT_FOUND, (f"the runtime on {target} reports no optimizer pass that "
                                                      "changed the candidate's graph: none to switch off")
        return report

    results: dict[frozenset, core.Step] = {}

    def step(subset) -> core.Step:
        key = frozenset(subset)
        if key not in results:
            results[key] = b.gate(tuple(subset), disabled_passes=tuple(sorted(subset)))[0]
        return results[key]

    def holds(subset: tuple[str, ...]) -> bool:
        return step(subset).outcome == core.PASS

    if not holds(tuple(searched)):
        every = step(searched)
        report.status = core.UNDECIDED if every.outcome == core.INCONCLUSIVE else core.NOT_FOUND
        report.note = (f"{b.check.label} does not pass on {target} even with all {len(searched)} passes off "
                       f"({every.outcome}, {core._fig(every.value)}): the optimizer passes are not the cause")
        report.check = b.check_json(first, every)
        return report
    # the last passes first: a failure that needs a chain of passes is completed by the one that picks the kernels
    # (a fusion), and switching that off keeps the earlier clean-ups; then from the other end for an alternative
    culprits = core.ddmin(list(reversed(searched)), holds)
    culprits = tuple(p for p in searched if p in culprits)
    report.status, report.culprits, report.check = core.FOUND, list(culprits), b.check_json(first, step(culprits))
    if alternatives:
        other = core.ddmin(searched, holds)
        if set(other) != set(culprits):
            report.alternatives.append(list(other))
    undecided = [s for s in b.steps if s.outcome == core.INCONCLUSIVE]
    if undecided:
        report.note = (f"{len(undecided)} step(s) were inconclusive and counted as failing: the set is minimal "
                       "among the decided ones")
    return report


def _check_passes(passes: list[str], run: GateRun, target: str) -> None:
    """Each --passes name must be a pass the tier's runtime reports running on the candidate (InputError, exit 2,
    the closest name offered): an unknown name switches nothing off, and the bisection would blame "not the
    passes" for nothing."""
    import difflib

    from tiergate.runtime_graph import known_passes

    graph = run.runtime.get(target)
    if not graph:
        return                             # no runtime graph to check against (the run failed): the gates say so
    known = known_passes(graph)
    for name in passes:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            raise InputError(f"--passes {name}: {target}'s runtime reports running no pass of that name on the "
                             "candidate" + (f" (did you mean {close[0]}?)" if close else
                                            f" (it reports {len(known)}: tiergate inspect CANDIDATE --target "
                                            f"{target} --json lists them)"))


def _passes_of(run: GateRun, target: str) -> list[str]:
    """The passes that changed the candidate's graph on `target`, as its runtime graph reports them."""
    from tiergate.runtime_graph import modified_by

    graph = run.runtime.get(target)
    return modified_by(graph) if graph else []


# --- a recipe's options -----------------------------------------------------------------------------------------


def read_options(path: Path, what: str) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{what} {path}: not valid TOML ({exc})") from None


def bisect_recipe(request: GateRequest, target: str, recipe: str, good: Path, bad: Path, *,
                  check: str | None = None, seams: Seams | None = None,
                  options: RunOptions | None = None) -> core.Report:
    """The smallest set of a recipe's options whose bad values make the check fail on `target`."""
    from tiergate.dataloader import load_function
    from tiergate.usercode import call

    make = load_function(recipe, "recipe")
    good_options, bad_options = read_options(good, "--good"), read_options(bad, "--bad")
    keys = sorted(set(good_options) | set(bad_options))
    differing = [k for k in keys if good_options.get(k, _MISSING) != bad_options.get(k, _MISSING)]
    b = _Bisector(request, target, check, seams, options)
    with tempfile.TemporaryDirectory(prefix="tiergate-recipe-") as tmp:
        made: dict[tuple[str, ...], Path] = {}

        def candidate(subset: tuple[str, ...]) -> Path:
            if subset not in made:
                chosen = {k: v for k, v in good_options.items()}
                for key in subset:
                    if key in bad_options:
                        chosen[key] = bad_options[key]
                    else:
                        chosen.pop(key, None)
                out = Path(tmp) / f"candidate-{len(made)}{Path(request.reference).suffix}"
                call(f"recipe {recipe}", make, dict(chosen), str(out))
                if not out.is_file():
                    raise InputError(f"recipe {recipe}: wrote no model to the output path it was given")
                made[subset] = out
            return made[subset]

        first, _ = b.gate(tuple(differing), candidate=candidate(tuple(differing)))
        report = core.Report("recipe", target, b.check_json(first, None), differing, steps=b.steps)
        if not differing:
            report.note = "the good and the bad configuration do not differ: nothing to bisect"
            return report
        if first.outcome != core.FAIL:
            report.status = core.UNDECIDED if first.outcome == core.INCONCLUSIVE else core.NOTHING
            report.note = (f"{b.check.label} {'is inconclusive' if first.outcome == core.INCONCLUSIVE else 'passes'} "
                           f"on {target} with the bad configuration: nothing to bisect")
            return report
        results: dict[tuple[str, ...], core.Step] = {tuple(differing): first}

        def fails(subset: tuple[str, ...]) -> bool:       # the bad values of `subset` alone break the check
            if subset not in results:
                results[subset] = b.gate(subset, candidate=candidate(subset))[0]
            return results[subset].outcome == core.FAIL

        good_step = b.gate((), candidate=candidate(()))[0]
        results[()] = good_step
        if good_step.outcome != core.PASS:
            report.status = core.UNDECIDED if good_step.outcome == core.INCONCLUSIVE else core.NOT_FOUND
            report.note = (f"{b.check.label} does not pass on {target} with the good configuration either "
                           f"({good_step.outcome}, {core._fig(good_step.value)})")
            return report
        culprits = core.ddmin(differing, fails)
        report.status, report.culprits = core.FOUND, list(culprits)
        report.check = b.check_json(results[culprits], good_step)
        return report


_MISSING = object()
