"""The orchestrator: one artifact's whole path, the one sequence every entry point calls.

intake -> build -> run -> compare -> decide, for the CLI (`tiergate gate`), the demo, explain's A/B and every
Prefect flow: `gate(request, seams, options)` (sequence.py). Its modules, dependencies flowing one way:

- `types`: Intake, RunSpec, RunDone, Basis (what a decision is made from besides its runs);
- `seams`: Builder / DockerBuilder (holds the build settings), Steps / ThreadSteps, Seams;
- `intake`: load, fingerprint, lint; the evaluation data; format, signature and label checks;
- `building`: an image per spec;
- `spans`: the pending runs of one tier over shards of the samples (PendingRuns), merge_shards;
- `running`: run keys, the run cache, run_tier / run_specs;
- `describing`: each tier's runtime graph of the candidate, in its run step;
- `deciding`: the decision from saved folders, and its cache;
- `early`: the early decision (looks at growing prefixes);
- `recording`: the registry's record of a gate;
- `sequence`: the gate;
- `explain_ab`: explain's candidates made by onnxruntime's quantizer from the FP32 reference;
- `explain_fix`: explain --fix, those candidates searched and gated through the same sequence.

Running and comparing stay apart: every run writes a result folder (tiergate.state owns where and how), and the
decision is computed from saved folders only.
"""

from tiergate.decision import GateRun
from tiergate.orchestrator.building import build_images
from tiergate.orchestrator.deciding import decide, decide_saved, decision_inputs, resolve_metrics
from tiergate.orchestrator.describing import Describing, describe_candidate
from tiergate.orchestrator.early import early_settings, gate_early
from tiergate.orchestrator.intake import (carried_outputs, check_formats, intake, load_data,
                                          signature_differences)
from tiergate.orchestrator.recording import record, record_or_reuse, reusable_decision
from tiergate.orchestrator.running import Running, load_outcomes, run_one, run_specs, run_tier, spec_key
from tiergate.orchestrator.seams import Builder, DockerBuilder, Seams, Steps, ThreadSteps, default_backend_for
from tiergate.orchestrator.sequence import gate
from tiergate.orchestrator.spans import merge_shards, shard_ranges
from tiergate.orchestrator.types import Basis, Intake, RunDone, RunSpec
from tiergate.request import BuildSettings, GateRequest, RunOptions

__all__ = [
    "Basis", "Builder", "BuildSettings", "Describing", "DockerBuilder", "GateRequest", "GateRun", "Intake",
    "RunDone", "RunOptions", "RunSpec", "Running", "Seams", "Steps", "ThreadSteps", "build_images",
    "carried_outputs", "check_formats", "decide", "decide_saved", "decision_inputs", "default_backend_for",
    "describe_candidate", "early_settings", "gate", "gate_early", "intake", "load_data", "load_outcomes",
    "merge_shards", "record", "record_or_reuse", "resolve_metrics", "reusable_decision", "run_one", "run_specs",
    "run_tier", "shard_ranges", "signature_differences", "spec_key",
]
