"""The registry of lint rules: one module per rule under lint/rules/, each with
RULE (its id), SEVERITY (its usual severity), DESCRIPTION and check(ctx) -> [Finding]."""

from __future__ import annotations

import importlib
from functools import cache
from types import ModuleType

RULE_MODULES = (
    "unfused_activation",
    "unfolded_batchnorm",
    "float_island",
    "default_calibration_range",
    "collapsed_calibration_range",
    "unsupported_op",
    "external_data_escape",
    "provider_fallback",
    "layout_reorder",
    "mixed_range_scale",
    "dynamic_quantization",
    "npu_fallback",
)


@cache
def all_rules() -> tuple[ModuleType, ...]:
    return tuple(importlib.import_module(f"tiergate.lint.rules.{name}") for name in RULE_MODULES)


def rule_ids() -> list[str]:
    return [module.RULE for module in all_rules()]
