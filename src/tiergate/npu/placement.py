"""What Vela's compile says of one artifact on one Ethos-U class, from its record (vela-meta.json, written by
containers/vela/tiergate_vela_compile.py; the harness copies it into a run's extra.npu without the per-layer rows).

Counted operators: the source model's operators (subgraph 0), less the float interface of an integer model (a QUANTIZE
that reads a model input, a DEQUANTIZE that writes a model output: on the CPU by construction, and reported apart).
The NPU share is the counted operators on the NPU over all counted ones. The estimate (inference time, cycles) is
Vela's for the NPU's part only: an operator on the CPU adds no time to it (docs/npu.md).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

KIB = 1.0


@dataclass
class Placement:
    operators: list[dict]
    summary: dict = field(default_factory=dict)
    accelerator: str = ""
    system_config: str = ""
    memory_mode: str = ""
    vela_version: str = ""

    @classmethod
    def from_record(cls, record: dict | None) -> "Placement | None":
        if not isinstance(record, dict) or not isinstance(record.get("operators"), list):
            return None
        return cls([dict(op) for op in record["operators"] if isinstance(op, dict)], dict(record.get("summary") or {}),
                   str(record.get("accelerator", "")), str(record.get("system_config", "")),
                   str(record.get("memory_mode", "")), str(record.get("vela_version", "")))

    # -- placement ---------------------------------------------------------------------------------------------
    @property
    def counted(self) -> list[dict]:
        return [op for op in self.operators if not op.get("interface")]

    @property
    def on_npu(self) -> list[dict]:
        return [op for op in self.counted if op.get("target") == "NPU"]

    @property
    def on_cpu(self) -> list[dict]:
        """The operators that fall back to the CPU (the float interface not among them)."""
        return [op for op in self.counted if op.get("target") == "CPU"]

    @property
    def interface(self) -> list[dict]:
        return [op for op in self.operators if op.get("interface")]

    @property
    def share(self) -> float | None:
        counted = self.counted
        return len(self.on_npu) / len(counted) if counted else None

    # -- Vela's estimate and memory ------------------------------------------------------------------------------
    def _figure(self, key: str) -> float | None:
        value = self.summary.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:   # NaN
            return None
        return float(value)

    @property
    def estimated_us(self) -> float | None:
        """Vela's estimated inference time of the NPU's part, in microseconds; None without NPU work."""
        seconds = self._figure("inference_time")
        return seconds * 1e6 if seconds else None

    @property
    def cycles(self) -> float | None:
        cycles = self._figure("cycles_total")
        return cycles if cycles else None

    @property
    def sram_kib(self) -> float | None:
        return self._figure("sram_memory_used")

    @property
    def flash_kib(self) -> float | None:
        parts = [self._figure("off_chip_flash_memory_used"), self._figure("on_chip_flash_memory_used")]
        return sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None

    @property
    def dram_kib(self) -> float | None:
        return self._figure("dram_memory_used")

    def to_json(self) -> dict:
        """The small form a decision keeps (TargetMetrics.npu, the registry's runtime summary)."""
        return {"accelerator": self.accelerator, "system_config": self.system_config, "memory_mode": self.memory_mode,
                "vela_version": self.vela_version, "operators": len(self.operators), "counted": len(self.counted),
                "npu_ops": len(self.on_npu), "cpu_ops": len(self.on_cpu), "interface_ops": len(self.interface),
                "npu_op_share": self.share, "estimated_us": self.estimated_us, "cycles": self.cycles,
                "cycles_npu": self._figure("cycles_npu"), "macs": self._figure("nn_macs"),
                "sram_kib": self.sram_kib, "flash_kib": self.flash_kib, "dram_kib": self.dram_kib,
                "clock_hz": self._figure("core_clock"),
                "cpu": [describe(op) for op in self.on_cpu],
                "interface": [location(op) for op in self.interface]}


def location(op: dict) -> str:
    """Where an operator is in the source model: 'operator #7 SOFTMAX (writes 'probs')'."""
    outputs = op.get("outputs") or []
    writes = f" (writes '{outputs[0]}')" if outputs else ""
    return f"operator #{op.get('index')} {op.get('op')}{writes}"


def describe(op: dict) -> str:
    """An operator on the CPU with Vela's reason, one line."""
    reason = op.get("reason") or "no reason given"
    return f"{location(op)}: {reason}"


def _keyed(placement: Placement) -> dict[tuple[str, int], dict]:
    """Operators by (type, occurrence): the k-th SOFTMAX of one model pairs with the k-th of the other, whatever
    the tensors are called."""
    seen: Counter = Counter()
    out = {}
    for op in placement.operators:
        seen[op.get("op")] += 1
        out[(op.get("op"), seen[op.get("op")])] = op
    return out


def diff(old: Placement, new: Placement, who: str = "the incumbent") -> dict[str, list[str]]:
    """How `new`'s placement differs from `old`'s (the incumbent's): operators that moved to the CPU (were on the
    NPU), that moved to the NPU, and CPU operators `old` does not have (counted ones only, by type and occurrence),
    each named with its location in `new` and Vela's reason."""
    a, b = _keyed(old), _keyed(new)
    to_cpu, to_npu, added = [], [], []
    for key, op in b.items():
        before = a.get(key)
        counted = not op.get("interface")
        if op.get("target") == "CPU" and counted:
            if before is not None and before.get("target") == "NPU":
                to_cpu.append(f"{describe(op)} (on the NPU in {who}: {location(before)})")
            elif before is None or before.get("interface"):
                added.append(describe(op))
        elif op.get("target") == "NPU" and before is not None and before.get("target") == "CPU" \
                and not before.get("interface"):
            to_npu.append(f"{location(op)} (on the CPU in {who})")
    return {"to_cpu": to_cpu, "to_npu": to_npu, "new_on_cpu": added}


def diff_lines(changes: dict[str, list[str]]) -> list[str]:
    words = {"to_cpu": "moved to the CPU", "to_npu": "moved to the NPU", "new_on_cpu": "new on the CPU"}
    return [f"{words[key]}: {item}" for key in words for item in changes.get(key, [])]
