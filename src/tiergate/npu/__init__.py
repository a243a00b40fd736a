"""The NPU tier (Arm Ethos-U through its compiler, Vela; docs/npu.md): the pure part.

- `spec`: a class's `[compile]` (accelerator, system configuration, memory mode) and `[numerics]` tables;
- `placement`: what Vela's compile recorded (vela-meta.json), as a placement per operator of the source model (NPU
  or CPU, with Vela's reason), the estimate (time, cycles) and the memory (SRAM, flash), and the diff of two;
- `checks`: the gate's checks on it (min_npu_op_share, max_cpu_ops, max_estimated_time_ratio, SRAM and flash
  budgets), called from gate.tier.TierEval.run.

Stdlib only. The compile itself (a container of Vela's image) is tiergate.vela; the run that computes the tier's
outputs is LiteRT's reference kernels (the harness's --runtime ethos-u).
"""

RUNTIME = "ethos-u"


def is_npu(device_class) -> bool:
    """Whether a device class is an NPU tier (its outputs are LiteRT's reference kernels, its time Vela's estimate)."""
    return getattr(device_class, "runtime", "") == RUNTIME
