"""inspect's table of an NPU tier's runtime graph (docs/npu.md): each source operator's placement, NPU or CPU with
Vela's reason, and the compile's estimate and memory (--json has the whole record)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tiergate.npu.placement import Placement


def print_placement(console: Console, title: str, graph: dict) -> None:
    placement = Placement.from_record(graph.get("npu"))
    if placement is None:
        console.print(f"{title}: no Vela record")
        return
    p = placement.to_json()
    share = "n/a" if p["npu_op_share"] is None else f"{p['npu_op_share']:.0%}"
    estimate = "no NPU work" if p["estimated_us"] is None else \
        f"{p['estimated_us']:.1f} us, {p['cycles']:.0f} cycles at {(p['clock_hz'] or 0) / 1e6:g} MHz"
    caption = (f"{p['accelerator']}, {p['system_config']}, {p['memory_mode']}: {p['npu_ops']} of {p['counted']} "
               f"operators on the NPU ({share}; {p['interface_ops']} float-interface conversions on the CPU, not "
               f"counted); estimated {estimate} (the NPU's part only); SRAM {_kib(p['sram_kib'])}, flash "
               f"{_kib(p['flash_kib'])}, DRAM {_kib(p['dram_kib'])}")
    table = Table(title=title, caption=caption)
    for column in ("#", "operator", "writes", "runs on", "Vela's reason"):
        table.add_column(column, overflow="fold")
    for op in placement.operators:
        where = op.get("target", "")
        if op.get("interface"):
            where += " (interface)"
        style = "red" if op.get("target") == "CPU" and not op.get("interface") else ""
        table.add_row(str(op.get("index")), str(op.get("op")), escape(", ".join(op.get("outputs") or [])),
                      f"[{style}]{where}[/]" if style else where, escape(op.get("reason") or ""))
    console.print(table)


def _kib(value) -> str:
    return "n/a" if value is None else f"{value:.2f} KiB"
