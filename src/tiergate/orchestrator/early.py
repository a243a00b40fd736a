"""Early decision: sequential looks at growing shares of the samples (on by default for emulated classes;
docs/policy.md).

A class with early stop on splits the samples into `looks` chunks, a seeded random partition stratified by label
(spans.sample_order: made from the seed and the samples' own bytes, so the file's order decides nothing); after
chunk k its runs of chunks 1..k are merged (spans.merge_shards) into prefix folders and judged on those m_k
samples (deciding.decide_saved, at the look's confidence, tiergate.stats.look_plan). A class stops at the first
look whose verdict is settled (tiergate.gate.settled), or at its last; only classes still undecided run the next
chunk. A look the plan does not take (too few samples for its share) is not judged, and its chunk runs with the
next taken look's, in one start. A class with early stop off, or whose plan takes no look before its last, runs
all samples at once, in file order (one look at the policy's confidence).
Every chunk is an ordinary run (its own content-hashed .npz, cached by the run cache); every look's decision is
cached.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tiergate import results, state
from tiergate.decision import INCONCLUSIVE, REJECT, Check, Decision, GateRun
from tiergate.execution.cancel import Cancel
from tiergate.evaldata import EvalData, sample_keys, select
from tiergate.gate import EARLY_METHOD, RunOutcome, TierLooks, combine_tiers, cross_tier_drift, settled, verdict_of
from tiergate.orchestrator.deciding import basis_inputs, cached_decision, decide_saved, named_runs
from tiergate.orchestrator.running import LabelCheck, Running, load_outcomes, run_specs
from tiergate.orchestrator.spans import merge_shards, partition, sample_order, shard_ranges
from tiergate.orchestrator.types import Basis, RunSpec, say
from tiergate.figures import AUTO_SPENDING, SPENDING
from tiergate.policy import EarlyStop, Policy
from tiergate.stats import Look, look_plan
from tiergate.targets import DeviceClass


def early_settings(policy: Policy, device_classes, early_stop: bool | None,
                   n_samples: int | None = None) -> dict[str, EarlyStop]:
    """Each class's early-decision settings when any class has it on (`early_stop` True/False: every class; None:
    the policy's, by default on for emulated classes); {} when it is off everywhere (the gate as it always was).
    With `n_samples`, a class whose look plan takes no look before its last (too few samples to resolve any
    earlier share) has one look: it runs every sample at once, in file order, as without early stop, and is still
    stopped by another class's final REJECT; with no other class to stop it, early stop is off for it. A gate none
    of whose classes is stopped or looks early is decided as the plain gate (gate_early)."""
    settings = {dc.name: policy.early_stop_for(dc) for dc in device_classes}
    if early_stop is not None:
        settings = {name: dataclasses.replace(e, enabled=early_stop) for name, e in settings.items()}
    if n_samples is not None:
        for dc in device_classes:
            e = settings[dc.name] = _spending(policy, dc, settings[dc.name], n_samples)
            if e.enabled and not _looks_early(policy, dc, e, n_samples):
                settings[dc.name] = dataclasses.replace(e, looks=1) if len(device_classes) > 1 else \
                    dataclasses.replace(e, enabled=False)
    return settings if any(e.enabled for e in settings.values()) else {}


def _spending(policy: Policy, dc: DeviceClass, setting: EarlyStop, n: int) -> EarlyStop:
    """The class's spending made concrete for n samples ("auto", the default): O'Brien-Fleming, which spends almost
    nothing early, so that its last look is nearly the plain gate's and an emulated tier judges the evidence a
    native tier judges alike. Where O'Brien-Fleming takes no look before the last (with 2 looks, below about 360
    samples: its first look at 0.9944 needs 179 or so), Kim-DeMets' alpha t^2, if that takes one (with 2 looks, from 160
    samples: look 1 at 0.9875 on half of them, the last at 0.9625); else O'Brien-Fleming's one look, which another
    class's final REJECT still stops. Pocock only where a policy names it: its last look is stricter still (0.9810
    on 160 samples: there a clear AVX2 loss and an INT8 equal to FP32 became INCONCLUSIVE on the emulated tiers
    while the native tier decided them). A choice made from the design (the looks, the confidence, the resamples,
    n), never the data."""
    if setting.spending != AUTO_SPENDING:
        return setting
    for spending in ("obrien-fleming", "kim-demets"):
        concrete = dataclasses.replace(setting, spending=spending)
        if _looks_early(policy, dc, concrete, n):
            return concrete
    return dataclasses.replace(setting, spending=SPENDING[0])


def _looks_early(policy: Policy, dc: DeviceClass, setting: EarlyStop, n: int) -> bool:
    """Whether the class's plan on n samples takes a look before its last."""
    return any(look.taken for look in _plan(policy, dc, setting, n)[:-1])


def _plan(policy: Policy, dc: DeviceClass, setting: EarlyStop, n: int) -> list[Look]:
    """The look plan of one class on n samples (it depends on the design only, never on the data)."""
    t = policy.for_target(dc)
    count = min(setting.looks if setting.enabled else 1, n)
    # a user metric's bootstrap makes the policy's resamples too (per-sample values), or as many as its time
    # budget pays for (one number for the whole set), its check inconclusive at a look whose confidence needs more
    return look_plan([b for _, b in shard_ranges(n, count)], t.confidence, setting.spending, t.bootstrap_resamples)


@dataclass
class _Tier:
    """One device class through its looks."""

    dc: DeviceClass
    specs: list[RunSpec]
    setting: EarlyStop
    confidence: float                   # the policy's, for this class
    ranges: list[tuple[int, int]]       # its chunks: positions in its order of the samples
    rows: list[np.ndarray]              # each chunk's samples: their positions in the file
    plan: list[Look]
    chunks: dict[str, list[Path]] = field(default_factory=dict)     # role -> its ok chunk folders, in order
    spans: dict[str, list[tuple[int, int]]] = field(default_factory=dict)   # role -> each folder's positions
    ran: int = 0                        # chunks run so far: a look the plan does not take runs with the next
    failed: dict[str, Path] = field(default_factory=dict)           # role -> the chunk run that failed
    decided: GateRun | None = None
    look: int = 0                       # the look it was decided at (1-based)
    judged: GateRun | None = None       # its last judged look's decision (settled or not)
    judged_look: int = 0
    stopped_by: str = ""                # the class whose final REJECT stopped it before it was decided


def _tiers(specs: list[RunSpec], basis: Basis, early: dict[str, EarlyStop]) -> dict[str, _Tier]:
    data, orders = basis.data, {}
    tiers: dict[str, _Tier] = {}
    for dc in basis.device_classes:
        setting, t = early[dc.name], basis.policy.for_target(dc)
        count = min(setting.looks if setting.enabled else 1, data.n_samples)
        if count > 1 and setting.seed not in orders:
            orders[setting.seed] = sample_order(sample_keys(data, setting.seed), data.labels, setting.seed)
        ranges, rows = partition(orders.get(setting.seed, np.arange(data.n_samples)), count)
        plan = _plan(basis.policy, dc, setting, data.n_samples)
        tiers[dc.name] = _Tier(dc, [s for s in specs if s.device_class.name == dc.name], setting, t.confidence,
                               ranges, rows, plan)
    return tiers


def _rows(t: _Tier, look: int) -> np.ndarray:
    """The samples class t is judged on at a look (1-based), in the order its prefix folders hold them."""
    return np.concatenate(t.rows[:look])


def gate_early(specs: list[RunSpec], basis: Basis, early: dict[str, EarlyStop], how: Running,
               labels_known: bool = True) -> GateRun:
    """Run and decide in looks (see the module's docstring); one GateRun naming every tier's own decision."""
    data = basis.data
    tiers = _tiers(specs, basis, early)
    chunk_data: dict[bytes, EvalData] = {}
    counts = [0, 0]                     # cache hits, runs started
    # a class with early stop on is stopped (its runs killed) once another class's final verdict is REJECT; every
    # class's runs stop when the labels are refused (checked against the first reference run that ends)
    cancels = {name: Cancel() for name in tiers}
    labels = None if labels_known else LabelCheck(data)
    guard = threading.Lock()
    for k in range(max(len(t.ranges) for t in tiers.values())):
        active = [t for t in tiers.values() if t.decided is None and not t.stopped_by and k < len(t.ranges)]
        if not active:
            break
        # a look the plan does not take is not judged: its chunk runs with the next taken look's (one start)
        due = [t for t in active if t.plan[k].taken or k == len(t.ranges) - 1]
        if not due:
            continue
        datas = {}
        for t in due:
            rows = np.concatenate(t.rows[t.ran:k + 1])
            if rows.tobytes() not in chunk_data:
                chunk_data[rows.tobytes()] = select(data, rows)
            datas[t.dc.name] = chunk_data[rows.tobytes()]
        todo = [s for t in due for s in t.specs if s.role not in t.failed]

        def tier_done(group: list[RunSpec], done: list, k: int = k) -> None:
            """A class's chunk judged as soon as its runs end (not after the slowest class's): a final REJECT
            stops the classes still running."""
            t = tiers[group[0].device_class.name]
            _after_chunk(t, k, group, done, basis, how)
            _stop_others(t, tiers, cancels, guard, how)

        round_how = dataclasses.replace(how, cancels=cancels, on_tier_done=tier_done, labels=labels)
        done = run_specs(todo, datas, round_how)
        counts[0] += sum(d.cached for d in done if d is not None)
        counts[1] += sum(d.started for d in done if d is not None)
    return _early_decision(tiers, basis, counts)


def _after_chunk(t: _Tier, k: int, specs: list[RunSpec], done: list, basis: Basis, how: Running) -> None:
    """Class t's runs of chunk k (through look k) kept in order, then look k judged (runs that ended before a stop
    reached them are judged as any: a class they decide is decided, not stopped)."""
    for spec, d in zip(specs, done):
        if results.load(d.folder).ok:
            t.chunks.setdefault(spec.role, []).append(d.folder)
            t.spans.setdefault(spec.role, []).append((t.ranges[t.ran][0], t.ranges[k][1]))
        else:
            t.failed[spec.role] = d.folder
    t.ran = k + 1
    _look(t, k, basis, how)
    if t.decided is not None:
        t.stopped_by = ""


def _stop_others(t: _Tier, tiers: dict[str, _Tier], cancels: dict[str, Cancel], guard: threading.Lock,
                 how: Running) -> None:
    """Once class t's final verdict is REJECT the gate's is too, whatever the others show: every other class with
    early stop on that is not decided yet is stopped (its running containers killed, no further chunk)."""
    if t.decided is None or verdict_of(t.decided.decision.checks) != REJECT:
        return
    with guard:
        for name, other in tiers.items():
            if other is t or other.decided is not None or other.stopped_by or not other.setting.enabled:
                continue
            other.stopped_by = t.dc.name
            say(how.options.progress, f"{name}: stopped: {t.dc.name}'s REJECT is final")
            cancels[name].set(f"{t.dc.name}'s REJECT is final")


def _look(t: _Tier, k: int, basis: Basis, how: Running) -> None:
    """Judge class t at look k when the plan takes it (or a run failed, or it is the last); decide it if settled."""
    look = t.plan[k]
    forced = "candidate" in t.failed or "reference" in t.failed     # a failed run is settled at any look
    last = k == len(t.ranges) - 1
    if not (look.taken or forced or last):
        return
    judged = _judge_look(t, k, basis, how.options.root or state.runs_root())
    t.judged, t.judged_look = judged, k + 1
    verdict = settled(judged.decision.checks)
    if verdict is not None or forced or last:
        t.decided, t.look = judged, k + 1
        if len(t.ranges) > 1:
            say(how.options.progress, f"{t.dc.name}: {verdict or verdict_of(judged.decision.checks)} at look "
                                      f"{k + 1} of {len(t.ranges)} ({look.samples} of {basis.data.n_samples} samples, "
                                      f"seed {t.setting.seed})")


def _judge_look(t: _Tier, k: int, basis: Basis, root: Path) -> GateRun:
    """One class's decision on its first m_k samples (at the look's confidence), from prefix folders."""
    look = t.plan[k]
    folders = {(s.role, t.dc.name): t.failed.get(s.role) or _prefix_folder(t.chunks[s.role], t.spans[s.role], root)
               for s in t.specs}
    confidence = look.confidence if look.taken else t.confidence
    extra = {"early_stop": {"look": k + 1, "looks": len(t.ranges), "spending": t.setting.spending,
                            "samples": look.samples, "confidence": confidence, "seed": t.setting.seed}}
    at_look = dataclasses.replace(basis, device_classes=(t.dc,), policy=_at_confidence(basis.policy, confidence),
                                  data=_prefix_data(basis.data, _rows(t, k + 1)))
    return decide_saved(folders, at_look, extra_inputs=extra)


def _early_decision(tiers: dict[str, _Tier], basis: Basis, counts: list[int]) -> GateRun:
    """The gate's decision from each class's own (decided at its look), cached as one decision naming them."""
    n, policy = basis.data.n_samples, basis.policy
    if all(len(t.ranges) == 1 and t.decided is not None for t in tiers.values()):
        # every class ran every sample at once and none was stopped: the plain gate's decision, as without early stop
        folders = {key: folder for t in tiers.values() for key, folder in t.decided.run_dirs.items()}
        return decide_saved(folders, basis, hits=counts[0], started=counts[1])
    for t in tiers.values():
        if t.decided is None:                       # stopped by another class's final REJECT
            t.decided, t.look = _stopped(t, basis), t.judged_look
    folders = {key: folder for t in tiers.values() for key, folder in t.decided.run_dirs.items()}
    outcomes = load_outcomes(folders)
    looks = {}
    for name, t in tiers.items():
        look = t.plan[max(t.look, 1) - 1]
        looks[name] = TierLooks(verdict_of(t.decided.decision.checks), t.look, len(t.ranges),
                                look.samples if t.look else 0, n, t.look < len(t.ranges) and not t.stopped_by,
                                t.setting.spending, look.confidence if look.taken else t.confidence, list(t.plan),
                                t.setting.seed, t.stopped_by)
    named = dict(folders)       # the chunk runs too: what a re-run reuses (and tiergate gc keeps)
    for t in tiers.values():
        for role, parts in t.chunks.items():
            named.update({(role, f"{t.dc.name}/chunk-{i}"): part for i, part in enumerate(parts, 1)})
        named.update({(role, f"{t.dc.name}/failed-chunk"): part for role, part in t.failed.items()})
    runs, images = named_runs(named)
    inputs = basis_inputs(basis) | {"early_stop": {name: t.to_json() for name, t in looks.items()},
                                    "tiers": {name: t.decided.decision_key for name, t in tiers.items()},
                                    "runs": runs, "images": images}
    key = state.decision_key_of(inputs)
    decision = cached_decision(key, inputs)
    cached = decision is not None
    if decision is None:
        rows = {name: _rows(t, t.look) for name, t in tiers.items() if t.look}
        common = _common_rows(rows)
        drift = {side: cross_tier_drift(_on_rows(outcomes.get(side, {}), rows, common))
                 for side in ("candidate", "reference")}
        on_inconclusive = {policy.for_target(t.dc).on_inconclusive for t in tiers.values()}
        decision = combine_tiers({name: t.decided.decision for name, t in tiers.items()}, looks, drift, policy,
                                 on_inconclusive, EARLY_METHOD + _order_method(tiers))
        if len(tiers) > 1 and common is not None and len(common) < max(t.samples_used for t in looks.values()):
            decision.notes.append(f"cross-tier drift compared on the {len(common)} samples every device class used")
        state.save_decision(key, inputs, decision.to_json())
    return GateRun(decision, folders, basis.intakes, outcomes, counts[0], counts[1], decision_cached=cached,
                   decision_key=key)


def _stopped(t: _Tier, basis: Basis) -> GateRun:
    """A class stopped by another's final REJECT: one inconclusive check saying so (its verdict is not known, and
    the gate's does not depend on it); the runs of its last judged look, if it had one, as its evidence."""
    by = t.stopped_by
    seen = (f"after look {t.judged_look} of {len(t.ranges)} ({t.plan[t.judged_look - 1].samples} samples), not "
            f"settled" if t.judged_look else "before its first look")
    check = Check(t.dc.name, t.dc.tier, "stopped", "stopped", None, "==", False, inconclusive=True,
                  detail=f"stopped {seen}: {by}'s REJECT is final, so the gate's verdict is REJECT whatever this "
                         f"class shows (--no-early-stop runs every class to its end)")
    decision = Decision(INCONCLUSIVE, [check], {}, {}, [], basis.intakes["candidate"].artifact.is_quantized,
                        list(basis.policy.sources))
    return GateRun(decision, dict(t.judged.run_dirs) if t.judged is not None else {}, basis.intakes,
                   decision_key=f"stopped-by-{by}-after-look-{t.judged_look}")


def _at_confidence(policy: Policy, confidence: float) -> Policy:
    """The policy with every interval at `confidence` (for one look of one device class)."""
    overrides = {name: {k: v for k, v in table.items() if k != "confidence"}
                 for name, table in policy.overrides.items()}
    return dataclasses.replace(policy, defaults=dataclasses.replace(policy.defaults, confidence=confidence),
                               overrides=overrides)


def _order_method(tiers: dict[str, _Tier]) -> str:
    seeds = sorted({t.setting.seed for t in tiers.values()})
    return ("; the chunks are a seeded random partition of the samples, stratified by label where labels are class "
            "indices, made from the seed and each sample's own bytes (never the file's order): seed "
            + (str(seeds[0]) if len(seeds) == 1 else ", ".join(f"{n} {t.setting.seed}" for n, t in tiers.items())))


def _prefix_data(data: EvalData, rows: np.ndarray) -> EvalData:
    """The samples at file positions `rows` (in that order) as the decision sees them: their labels, and an
    identity of their own; all of them in file order is the data itself."""
    if len(rows) == data.n_samples and np.array_equal(rows, np.arange(data.n_samples)):
        return data
    identity = hashlib.sha256(f"{data.sha256}\0rows\0".encode() + rows.astype("<i8").tobytes()).hexdigest()
    return dataclasses.replace(data, sha256=identity, n_samples=len(rows),
                               labels=None if data.labels is None else data.labels[rows])


def _prefix_folder(parts: list[Path], spans: list[tuple[int, int]], root: Path) -> Path:
    """One artifact's run on the first chunks: their folders merged in sample order (itself for one chunk),
    named by the chunks' run keys, reused while it verifies."""
    if len(parts) == 1:
        return parts[0]
    key = hashlib.sha256(("prefix\0" + "\0".join(p.name for p in parts)).encode()).hexdigest()[:24]
    folder = root / key
    with state.key_lock(key):
        if not state.verified(folder, quiet=True):
            with state.writing_folder(folder) as work:
                merge_shards(parts, work, spans)
    return folder


def _common_rows(rows: dict[str, np.ndarray]) -> np.ndarray | None:
    """The samples every class was judged on (file positions, ascending); None when every class has the same
    samples in the same order (nothing to align)."""
    first = next(iter(rows.values()))
    if all(np.array_equal(r, first) for r in rows.values()):
        return None
    return functools.reduce(np.intersect1d, rows.values())


def _on_rows(outcomes: dict[str, RunOutcome], rows: dict[str, np.ndarray],
             common: np.ndarray | None) -> dict[str, RunOutcome]:
    """The outcomes on the common samples, row for row (outputs have the sample axis first, as merged shards)."""
    if common is None:
        return outcomes
    aligned = {}
    for name, o in outcomes.items():
        if o.ok:
            sorter = np.argsort(rows[name], kind="stable")
            at = sorter[np.searchsorted(rows[name], common, sorter=sorter)]
            o = RunOutcome(o.result, {k: v[at] for k, v in o.outputs.items()})
        aligned[name] = o
    return aligned
