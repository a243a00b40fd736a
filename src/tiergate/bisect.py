"""`tiergate bisect`'s pure part: delta debugging (Zeller and Hildebrandt's ddmin) over a list of changes, and
what a bisection reports.

A bisection asks one question of a set of changes (optimizer passes switched off, or a recipe's options moved from
their good to their bad value): does the check hold with this set applied? `ddmin(items, holds)` finds a
1-minimal set on which it holds (removing any one of its items breaks it), asking each subset once (answers are
remembered). For one culprit among n items it asks about 2 log2(n) questions; at worst O(n^2). Each question is a
gate (orchestrator/bisect.py), so the answers are three-valued: a state is fixed when its failing check no longer
fails (`no_longer_fails`: it passes, or it is inconclusive with its estimate back on the passing side); the report
gives every state's figure with its interval, so it says how sure each answer is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tiergate.codec import encode
from tiergate.fmt import number

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
FOUND, NOT_FOUND, UNDECIDED, NOTHING = "found", "not-found", "inconclusive", "nothing-to-bisect"
EXIT = {FOUND: 0, NOTHING: 0, NOT_FOUND: 1, UNDECIDED: 3}


def ddmin(items: Sequence[str], holds: Callable[[tuple[str, ...]], bool]) -> tuple[str, ...]:
    """A 1-minimal subset of `items` on which `holds` is true, given that it holds on all of them (the caller
    checks that first, and that it does not hold on none). Subsets keep the items' order; `holds` is asked each
    subset at most once."""
    memo: dict[tuple[str, ...], bool] = {}

    def ask(subset: tuple[str, ...]) -> bool:
        if subset not in memo:
            memo[subset] = bool(holds(subset))
        return memo[subset]

    current, n = tuple(items), 2
    memo[current] = True
    while len(current) >= 2:
        chunks = _split(current, n)
        for chunk in chunks:                                       # one chunk alone
            if ask(chunk):
                current, n = chunk, 2
                break
        else:
            for chunk in chunks:                                   # everything but one chunk
                rest = tuple(item for item in current if item not in chunk)
                if n > 2 and ask(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(len(current), 2 * n)
    return current


def _fig(value) -> str:
    return number(value, missing="-")


def _split(items: tuple[str, ...], n: int) -> list[tuple[str, ...]]:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        stop = start + size + (1 if i < extra else 0)
        if stop > start:
            out.append(items[start:stop])
        start = stop
    return out


@dataclass
class Step:
    """One gate of the bisection: what was applied, and the check's outcome and figure."""

    applied: list[str]                 # passes switched off / recipe options set to their bad value
    outcome: str                       # pass / fail / inconclusive (the check's)
    value: float | str | None = None
    low: float | None = None           # the value's confidence interval, where the check has one
    high: float | None = None
    verdict: str = ""                  # the whole gate's verdict on the tier
    reused: bool = False               # every run came from the run cache
    fixed: bool = False                # the check no longer fails here (no_longer_fails)

    def to_json(self) -> dict:
        return encode(self)

    def figure(self) -> str:
        """'0.918 [0.89, 0.94]': the value and, where the check has one, its interval."""
        if self.low is None or self.high is None:
            return _fig(self.value)
        return f"{_fig(self.value)} [{_fig(self.low)}, {_fig(self.high)}]"


def no_longer_fails(outcome: str, value, op: str, threshold) -> bool:
    """A state the search counts as fixed: its check passes, or it is inconclusive with its estimate back on the
    passing side of the threshold (the value at the reference's: the interval straddles the threshold only because
    the samples are few). An inconclusive state whose estimate still fails is not fixed, and a failing one never."""
    if outcome == PASS:
        return True
    if outcome != INCONCLUSIVE or not isinstance(value, (int, float)) or not isinstance(threshold, (int, float)):
        return False
    return {">=": value >= threshold, ">": value > threshold, "<=": value <= threshold,
            "<": value < threshold}.get(op, False)


@dataclass
class Report:
    """A bisection's result (`--json` prints `to_json()`): the culprits, every step, the check."""

    kind: str                          # "passes" or "recipe"
    target: str
    check: dict                        # {"label", "op", "threshold", "before", "after"}
    searched: list[str]                # the items bisected, in order
    status: str = NOTHING
    culprits: list[str] = field(default_factory=list)
    alternatives: list[list[str]] = field(default_factory=list)   # other minimal sets found (searched from the end)
    steps: list[Step] = field(default_factory=list)
    note: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT[self.status]

    def to_json(self) -> dict:
        return {"kind": self.kind, "target": self.target, "status": self.status, "culprits": list(self.culprits),
                "alternatives": [list(a) for a in self.alternatives],
                "check": dict(self.check), "searched": list(self.searched), "steps": [s.to_json() for s in self.steps],
                "gates": len(self.steps), "note": self.note}

    def lines(self) -> list[str]:
        """The text report: the culprit and the figure before and after, then the steps."""
        check = self.check
        what, whats = ("optimizer pass", "optimizer passes") if self.kind == "passes" else ("recipe option",
                                                                                            "recipe options")
        head = f"bisect on {self.target}: {check.get('label')} must be {check.get('op')} {_fig(check.get('threshold'))}"
        out = [head]
        if self.status == FOUND:
            names = ", ".join(self.culprits)
            verb = "switched off" if self.kind == "passes" else "changed"
            plural = "s" if len(self.culprits) > 1 else ""
            named = whats if plural else what
            before, after = self._figure("before"), self._figure("after")
            if self.kind == "passes":
                out.append(f"culprit{plural}: {named} {names}: {check.get('label')} is {before} with it, {after} "
                           f"with it {verb}")
            else:
                out.append(f"culprit{plural}: {named} {names}: {check.get('label')} is {before} with the bad "
                           f"value{plural}, {after} with the good")
            for other in self.alternatives:
                out.append(f"also enough alone: {', '.join(other)} (switching it off passes the check too)")
        elif self.note:
            out.append(self.note)
        out.append(f"{len(self.steps)} gate{'s' if len(self.steps) != 1 else ''} over {len(self.searched)} "
                   f"{whats if len(self.searched) != 1 else what}:")
        for step in self.steps:
            applied = ", ".join(step.applied) if step.applied else "(none)"
            cached = " (cached)" if step.reused else ""
            fixed = " (back at the reference's: counted as fixed)" if step.fixed and step.outcome != PASS else ""
            out.append(f"  {step.outcome:12} {step.figure():>26}  {applied}{cached}{fixed}")
        return out

    def _figure(self, key: str) -> str:
        """check[key]'s value, with its interval when a step says it ("before": the first step's, "after": the
        step the check's "after" came from)."""
        interval = self.check.get(f"{key}_interval") or []
        value = _fig(self.check.get(key))
        return f"{value} [{_fig(interval[0])}, {_fig(interval[1])}]" if len(interval) == 2 else value
