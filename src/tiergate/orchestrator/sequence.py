"""The one gate sequence every entry point calls: intake -> build -> run -> compare -> decide.

The CLI (`tiergate gate`), the demo, explain's A/B and every Prefect flow call `gate(request, seams, options)`:
`request` (tiergate.request.GateRequest) is what is decided, `seams` what is called out to (builder, backends,
steps), `options` (RunOptions) how the work is done. User errors raise before anything is built or run.
"""

from __future__ import annotations

import dataclasses

from tiergate import leases, usercode
from tiergate.artifact.precision import check_reference
from tiergate.decision import GateRun
from tiergate.evaldata import ReadAhead, is_loader
from tiergate.execution import counting
from tiergate.execution.cancel import Cancel
from tiergate.gate import signature_decision
from tiergate.orchestrator.building import build_images
from tiergate.orchestrator.deciding import bootstraps, decide_saved, output_kinds, resolve_metrics
from tiergate.orchestrator.describing import Describing
from tiergate.orchestrator.early import early_settings, gate_early
from tiergate.orchestrator.intake import check_formats, intake, labels_checked, load_data, signature_differences
from tiergate.orchestrator.recording import check_registered
from tiergate.orchestrator.running import LabelCheck, Running, run_specs
from tiergate.orchestrator.seams import Seams
from tiergate.orchestrator.types import Basis, RunSpec, say, tell
from tiergate.request import GateRequest, RunOptions, candidate_class


@leases.for_its_life         # the images it uses are leased: no tiergate gc, in any home, removes them meanwhile
def gate(request: GateRequest, seams: Seams | None = None, options: RunOptions | None = None) -> GateRun:
    """Intake, signature check, build, run, compare and decide.

    A candidate (or incumbent) whose signature differs from the reference's is rejected with the differences
    named, before anything is built or run. The decision never depends on `options` (shards, parallelism);
    `request.early_stop` decides each tier at the first look whose verdict is settled (early.py).
    """
    seams, options = seams or Seams(), options or RunOptions()
    builder = seams.the_builder()
    device_classes = list(request.device_classes)
    seams.janitor(device_classes)
    roles = list(request.artifacts.items())
    # the archive's hash and float arrays read on a thread while the models are taken in (a loader runs later)
    ahead = None if is_loader(request.data) else ReadAhead(request.data)
    intakes = dict(zip([r for r, _ in roles],
                       seams.steps.map("intake", lambda rp: intake(rp[1], device_classes), roles,
                                       name=lambda rp: rp[0])))
    if options.records and options.registry is not None:
        check_registered(options.registry, intakes["candidate"])
    basis = _basis(request, intakes, ahead)
    differences = signature_differences(intakes)
    if differences:
        say(options.progress, "signature differs from the reference's: nothing built or run")
        decision = signature_decision(differences, device_classes, request.policy,
                                      quantized=intakes["candidate"].artifact.is_quantized)
        return GateRun(decision, intakes=intakes)
    labels_known = labels_checked(basis.data, intakes)
    partners = tuple(intakes[r] for r in ("reference", "incumbent") if r in intakes)
    specs = [RunSpec(role, candidate_class(dc, request) if role == "candidate" else dc, item, profile=request.profile,
                     count=request.profile or request.policy.for_target(dc).asks_instructions,
                     pair_with=partners if role == "candidate" else ())
             for role, item in intakes.items() for dc in device_classes]
    counting.ensure_built([s.device_class for s in specs if s.count], lambda text: tell(options.progress, text))
    _build(specs, seams, options, basis.data.call_shapes())
    how = Running(seams, options, Describing(builder, options.progress), bootstraps=bootstraps(basis))
    early = early_settings(request.policy, device_classes, request.early_stop, basis.data.n_samples)
    with usercode.reporting(options.progress):      # a user metric's long bootstrap says how it goes
        if early:
            run = gate_early(specs, basis, early, how, labels_known)
        else:
            run = _gate_whole(specs, basis, how, labels_known)
    for dc in device_classes:
        item = how.describe.done.get(dc.name)
        if item is not None:
            run.runtime[dc.name], run.runtime_findings[dc.name] = item
    run.data_origin = {**basis.data.origin, "archive": basis.data.sha256}
    return run


def _basis(request: GateRequest, intakes: dict, ahead: ReadAhead | None = None) -> Basis:
    """What the decision is made from: user errors in the data, the sample axes or the metrics raise here."""
    from tiergate.errors import InputError
    from tiergate.evaldata import parse_sample_axes

    device_classes = list(request.device_classes)
    check_formats(intakes, device_classes)
    if "reference" in intakes:           # the one rule of every path (register, MLflow): an FP32 reference
        check_reference(intakes["reference"].artifact)
    axes = parse_sample_axes(list(request.sample_axes))
    known = list(dict.fromkeys(t.name for item in intakes.values()
                               for t in (*item.artifact.inputs, *item.artifact.outputs)))
    for name in axes:
        if name not in known:
            raise InputError(f"--sample-axis {name}={axes[name]}: '{name}' is not an input or output of the models "
                             f"(known: {', '.join(known)})")
    data = load_data(request.data, intakes, axes, request.policy, device_classes, ahead=ahead)
    metrics = resolve_metrics(list(request.metrics), request.policy)
    reference = intakes.get("reference") or intakes["candidate"]
    kinds = output_kinds(reference.artifact, request.policy)
    return Basis(intakes, tuple(device_classes), request.policy, data, tuple(metrics), kinds)


def _build(specs: list[RunSpec], seams: Seams, options: RunOptions, shapes: dict | None = None) -> None:
    """Every spec's image, one device class at a time (an environment problem raises); `shapes`: one call's input
    shapes from the data (EvalData.call_shapes), for the classes that compile the artifact at static shapes."""
    per_class: dict[str, list[RunSpec]] = {}
    for spec in specs:
        per_class.setdefault(spec.device_class.name, []).append(spec)
    seams.steps.map("build", lambda group: build_images(group, seams.the_builder(), progress=options.progress,
                                                        input_shapes=shapes),
                    list(per_class.values()), limit=1, name=lambda group: group[0].device_class.name)


def _gate_whole(specs: list[RunSpec], basis: Basis, how: Running, labels_known: bool) -> GateRun:
    """Every spec on every sample, then the decision (the gate without early stop)."""
    if not labels_known:        # checked on the first reference run that ends; refused, every class's runs stop
        how = dataclasses.replace(how, labels=LabelCheck(basis.data),
                                  cancels={dc.name: Cancel() for dc in basis.device_classes})
    done = run_specs(specs, basis.data, how)
    folders = {(d.role, d.device_class): d.folder for d in done}
    return decide_saved(folders, basis, hits=sum(d.cached for d in done), started=sum(d.started for d in done))
