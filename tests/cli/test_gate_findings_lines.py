"""The gate's table of a tier's runtime findings: the same message about different nodes is one line that counts
them and names the first (a detector's 13 float islands of one Div each were 13 identical lines)."""

from __future__ import annotations

from tiergate.cli.gate_output import _grouped_findings
from tiergate.lint.finding import Finding


def _island(i: int) -> Finding:
    return Finding("float-island", "warning", "1 float node(s) (Div) between quantized regions", nodes=(i,),
                   node_names=(f"p2o.Div.{i}",))


def test_repeated_messages_are_counted_once_with_their_nodes():
    found = [_island(i) for i in range(6)] + [
        Finding("unfused-activation", "warning", "Relu after Conv is not fused", nodes=(9,), node_names=("r",)),
        Finding("info-rule", "info", "said only in --json")]
    lines = _grouped_findings(found)
    assert lines == [
        (("warning", "float-island", "1 float node(s) (Div) between quantized regions"),
         " (6 times: p2o.Div.0, p2o.Div.1, p2o.Div.2, p2o.Div.3, ...)"),
        (("warning", "unfused-activation", "Relu after Conv is not fused"), "")]
