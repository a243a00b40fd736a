"""The graph a tier's runtime really runs, read from what the describer wrote in its container.

containers/harness/tiergate_describe.py runs inside the device class's runtime image and
writes `describe.json` (and, for onnxruntime, the optimized model at each level). This
module turns such a folder into a `RuntimeGraph`: op counts ("domain:op_type" -> n) and a
fingerprint per optimization level, the execution-provider (or XNNPACK delegate)
placement, and the runtime's own message when it refused the model. Pure: no Docker here
(tiergate.execution.describe runs the container and keeps the cache).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tiergate.artifact.model import Artifact
from tiergate.decision import changed_passes      # its one home is light (decision.pass_summary uses it too)
from tiergate.errors import InputError
from tiergate.fingerprint import Fingerprint, fingerprint
from tiergate.images import DESCRIBE_FILE  # noqa: F401 - the one name of the describer's file (importers use it)

LEVELS = ("basic", "extended", "all")


def described_level(name: str) -> bool:
    """A file name the describer writes beside describe.json: the optimized model at one level."""
    return name.startswith("optimized-") and name.endswith(".onnx")


def described_files(folder: Path) -> list[Path]:
    """The describer's files in a folder (describe.json and the optimized models), none when it has no
    describe.json."""
    folder = Path(folder)
    if not (folder / DESCRIBE_FILE).is_file():
        return []
    return [folder / DESCRIBE_FILE] + sorted(p for p in folder.iterdir() if described_level(p.name))
SCHEMA = 1


@dataclass
class LevelGraph:
    """The optimized graph onnxruntime writes at one level."""

    level: str
    ops: dict[str, int]                 # "domain:op_type" -> count ("com.microsoft:FusedConv")
    fingerprint: Fingerprint
    node_count: int
    artifact: Artifact | None = None    # the optimized model, loaded (lint reads it)

    def to_json(self) -> dict:
        return {"ops": self.ops, "node_count": self.node_count, "fingerprint": self.fingerprint.to_json()}


@dataclass
class RuntimeGraph:
    target: str                         # device class name
    tier: str
    runtime: str
    machine: str                        # what the container's `uname -m` said
    emulated: bool
    image: str
    image_id: str
    artifact_sha256: str
    ok: bool
    error: str = ""                     # the runtime's own message when it refused the model
    versions: dict[str, str] = field(default_factory=dict)
    default_level: str = ""             # onnxruntime: the level the tier's harness runs
    levels: dict[str, LevelGraph] = field(default_factory=dict)
    providers: list[str] = field(default_factory=list)
    placement: dict[str, int] = field(default_factory=dict)   # provider / "xnnpack" | "default" -> nodes
    nodes: list[list] = field(default_factory=list)           # [name or index, op, provider or delegate]
    ops: dict[str, int] = field(default_factory=dict)         # tflite: builtin/custom op -> count
    needs_delegate: list[str] = field(default_factory=list)   # tflite: what fails without XNNPACK
    seconds: float = 0.0                # the container run that produced it
    cached: bool = False
    cpu: dict = field(default_factory=dict)   # the CPU the runtime saw: {"model", "features"} (CPUID / HWCAP)
    disabled: list[str] = field(default_factory=list)         # passes switched off (DeviceClass.disabled_passes)
    # onnxruntime: per level, [name, times applied, times it modified the graph] in first-applied order (its own
    # verbose log): the passes `tiergate bisect` searches are those that modified the graph
    transformers: dict[str, list] = field(default_factory=dict)
    # tvm: each pass the compile applied, in order, with the structural hash of the module after it ({"name",
    # "fingerprint"}), and the compile's record (target, opt level, TVM version, timings: compile_record)
    passes: list[dict] = field(default_factory=list)
    compile: dict = field(default_factory=dict)
    # tvm: the lowered graph, one entry per kernel main calls ({"name", "kernel", "ops", "inputs", "dtype"}, the
    # compile's kernel_graph): what the graph rules judge on a compiled tier (tiergate.lint.kernels)
    kernels: list[dict] = field(default_factory=list)
    # ethos-u: Vela's record (each source operator's placement with its reason, the estimate, memory: vela-meta.json,
    # containers/vela/tiergate_vela_compile.py); `placement` counts "npu" and "cpu" operators, `nodes` are
    # [index, op, "npu" | "cpu"]
    npu: dict = field(default_factory=dict)

    def modified_by(self) -> list[str]:
        """The optimizer passes that changed the graph at the tier's own level, in order (`modified_by`)."""
        return modified_by(self.to_json())

    @property
    def runtime_artifact(self) -> Artifact | None:
        """The optimized graph at the tier's own level (what it executes), when there is one."""
        level = self.levels.get(self.default_level)
        return level.artifact if level else None

    def fingerprints(self) -> dict[str, Fingerprint]:
        return {name: lvl.fingerprint for name, lvl in self.levels.items()}

    def to_json(self) -> dict:
        doc = {"target": self.target, "tier": self.tier, "runtime": self.runtime, "machine": self.machine,
               "emulated": self.emulated, "image": self.image, "image_id": self.image_id,
               "ok": self.ok, "error": self.error, "versions": self.versions,
               "placement": self.placement, "nodes": self.nodes,
               "seconds": self.seconds, "cached": self.cached,
               "cpu": {k: v for k, v in self.cpu.items() if k in ("model", "features")}, "disabled": self.disabled}
        if self.runtime.startswith("onnxruntime"):
            doc.update(default_level=self.default_level, providers=self.providers, transformers=self.transformers,
                       levels={name: lvl.to_json() for name, lvl in self.levels.items()},
                       ops={name: lvl.ops for name, lvl in self.levels.items()},
                       fingerprints={name: lvl.fingerprint.to_json() for name, lvl in self.levels.items()})
        elif self.runtime == "tvm":
            doc.update(passes=self.passes, compile=self.compile, kernels=self.kernels)
        elif self.runtime == "ethos-u":
            doc.update(ops=self.ops, npu=self.npu)
        else:
            doc.update(ops=self.ops, needs_delegate=self.needs_delegate)
        return doc


def parse_describe(folder: Path, *, target: str, tier: str, runtime: str, emulated: bool, image: str,
                   image_id: str, artifact_sha256: str, seconds: float | None = None,
                   cached: bool = False, source: Path | None = None) -> RuntimeGraph:
    """A RuntimeGraph from a describer's output folder (raises InputError when it is unreadable). `seconds`: the
    describe's time; None: its sessions' own (a describe made in a run, which has no container of its own).
    `source`: the described artifact's file, whose ONNX external data the optimized models still name."""
    folder = Path(folder)
    try:
        doc = json.loads((folder / DESCRIBE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{folder}: no readable {DESCRIBE_FILE} from the runtime describer ({exc})") from None
    return from_describe(doc, folder, target=target, tier=tier, runtime=runtime, emulated=emulated, image=image,
                         image_id=image_id, artifact_sha256=artifact_sha256, seconds=seconds, cached=cached,
                         source=source)


def from_describe(doc: dict, folder: Path | None, *, target: str, tier: str, runtime: str, emulated: bool,
                  image: str, image_id: str, artifact_sha256: str, seconds: float | None = None,
                  cached: bool = False, source: Path | None = None) -> RuntimeGraph:
    """A RuntimeGraph from a describe.json document; `folder` holds the optimized models it names (onnxruntime),
    None where it names none (a compile's record made on the host: compiler.compiled_graph)."""
    graph = RuntimeGraph(target=target, tier=tier, runtime=runtime, machine=doc.get("machine", ""),
                         emulated=emulated, image=image, image_id=image_id, artifact_sha256=artifact_sha256,
                         ok=bool(doc.get("ok")), error=doc.get("error", ""), versions=doc.get("versions", {}),
                         seconds=seconds if seconds is not None else
                         sum(float(level.get("seconds", 0.0)) for level in (doc.get("levels") or {}).values()),
                         cached=cached, cpu=dict(doc.get("cpu") or {}), disabled=list(doc.get("disabled") or []),
                         transformers=dict(doc.get("transformers") or {}))
    if not graph.ok:
        return graph
    if runtime == "tvm":
        return _compiled(graph, doc.get("tvm") or {})
    if runtime == "ethos-u":
        return _vela(graph, doc.get("vela") or {})
    if runtime == "tflite":
        graph.ops = doc.get("ops", {})
        graph.nodes = doc.get("nodes", [])
        graph.placement = dict(Counter(where for _, _, where in graph.nodes))
        graph.needs_delegate = [d["message"] for d in doc.get("needs_delegate", [])]
        return graph
    graph.default_level = doc.get("default_level", "all")
    graph.providers = doc.get("providers", [])
    for name in LEVELS:
        level = doc.get("levels", {}).get(name)
        if level:
            graph.levels[name] = _level(folder / level["file"], name, source)
    own = doc.get("levels", {}).get(graph.default_level) or {}
    graph.nodes = own.get("nodes", [])
    graph.placement = own.get("placement", {})
    return graph


def _level(path: Path, name: str, source: Path | None = None) -> LevelGraph:
    from tiergate.artifact.onnx_loader import load_onnx

    artifact = load_onnx(path, _with_source_data(path, path.read_bytes(), source), check=False)
    ops = Counter(f"{n.domain}:{n.op}" for n in artifact.nodes)
    return LevelGraph(name, dict(sorted(ops.items())), fingerprint(artifact), len(artifact.nodes), artifact)


def _with_source_data(path: Path, data: bytes, source: Path | None) -> bytes:
    """An optimized model's bytes with the external data it still names (onnxruntime writes the initializers it did
    not change as references to the artifact's own external data files) read in from the artifact's folder (each
    location checked there: hashing.safe_location). Unchanged when it names none, or nothing is known of `source`."""
    if source is None or b"location" not in data:
        return data
    import onnx

    from tiergate.artifact.external import external_tensors
    from tiergate.hashing import safe_location

    model = onnx.ModelProto.FromString(data)
    tensors = [t for t in external_tensors(model) if not (path.parent / _location(t)).is_file()]
    if not tensors:
        return data
    blobs: dict[str, bytes] = {}
    for tensor in tensors:
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location", "")
        if location not in blobs:
            blobs[location] = safe_location(Path(source), location).read_bytes()
        offset, blob = int(entries.get("offset") or 0), blobs[location]
        length = int(entries["length"]) if entries.get("length") else len(blob) - offset
        if offset < 0 or length < 0 or offset + length > len(blob):
            raise InputError(f"{path}: external data {location!r} of the artifact is too short")
        tensor.raw_data = blob[offset:offset + length]
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    try:
        return model.SerializeToString()
    except ValueError as exc:                       # protobuf's 2 GiB
        raise InputError(f"{path}: the optimized model with its weights is too large to read ({exc})") from None


def _location(tensor) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


COMPILE_RECORD = ("tvm_version", "target", "target_text", "opt_level", "disabled_passes", "pipeline", "inputs",
                  "outputs", "folded", "kernels_after", "static_seconds", "import_seconds", "compile_seconds", "export_seconds",
                  "total_seconds")


def _compiled(graph: RuntimeGraph, record: dict) -> RuntimeGraph:
    """A compiled artifact's graph from its compile record (tvm-meta.json, containers/tvm/tiergate_tvm_compile.py):
    the passes applied and the compile's settings and times."""
    graph.passes = [{"name": str(p["name"]), "fingerprint": str(p["fingerprint"])} for p in record.get("passes", [])]
    graph.compile = {key: record[key] for key in COMPILE_RECORD if key in record}
    graph.compile["pass_count"] = len(graph.passes)
    graph.kernels = [dict(k) for k in record.get("kernels") or []]
    graph.disabled = graph.disabled or list(record.get("disabled_passes", []))
    return graph


def _vela(graph: RuntimeGraph, record: dict) -> RuntimeGraph:
    """An Ethos-U compile's graph from Vela's record: each source operator on the NPU or the CPU (the float interface
    of an integer model on the CPU too, marked), op counts, and the record itself."""
    operators = [op for op in record.get("operators") or [] if isinstance(op, dict)]
    graph.nodes = [[op.get("index"), op.get("op"), str(op.get("target", "")).lower()] for op in operators]
    graph.placement = dict(Counter(where for _, _, where in graph.nodes))
    graph.ops = dict(Counter(str(op.get("op")) for op in operators))
    graph.npu = dict(record)
    return graph


def modified_by(graph: dict) -> list[str]:
    """The optimizer passes that changed the graph a tier runs, each once, in the order they ran, from a runtime
    graph's JSON (`RuntimeGraph.to_json()`, as a gate keeps it): onnxruntime's graph transformers that modified it at
    the tier's own level; "XNNPACK" for LiteRT when the delegate took nodes; TVM's passes after which the module's
    fingerprint changed. What `tiergate bisect` searches."""
    runtime = str(graph.get("runtime", ""))
    if runtime == "tflite":
        return ["XNNPACK"] if (graph.get("placement") or {}).get("xnnpack") else []
    if runtime == "tvm":
        return list(dict.fromkeys(p["name"] for p in changed_passes(graph.get("passes") or [])))
    level = graph.get("default_level", "all")
    return [name for name, _, modified in (graph.get("transformers") or {}).get(level, []) if modified]


def known_passes(graph: dict) -> list[str]:
    """Every optimizer pass the tier's runtime reports running on the candidate (changed the graph or not): what a
    pass name given to `tiergate bisect --passes` may be. onnxruntime's graph transformers at any level, "XNNPACK"
    for LiteRT, TVM's passes."""
    runtime = str(graph.get("runtime", ""))
    if runtime == "tflite":
        return ["XNNPACK"]
    if runtime == "tvm":
        return list(dict.fromkeys(p["name"] for p in graph.get("passes") or []))
    return list(dict.fromkeys(name for level in (graph.get("transformers") or {}).values() for name, *_ in level))


def first_pass_difference(old: list[dict], new: list[dict]) -> int | None:
    """The index of the first pass at which two compiles' pass lists differ (by name or fingerprint); None when they
    are the same."""
    for i, (a, b) in enumerate(zip(old, new)):
        if a["name"] != b["name"] or a["fingerprint"] != b["fingerprint"]:
            return i
    return None if len(old) == len(new) else min(len(old), len(new))


def first_difference(old: RuntimeGraph, new: RuntimeGraph) -> str | None:
    """The first optimization level at which two artifacts' runtime graphs differ in structure,
    weights or quantization; None when they are the same at every level (or both have none)."""
    for name in LEVELS:
        a, b = old.levels.get(name), new.levels.get(name)
        if a is None and b is None:
            continue
        if a is None or b is None or a.fingerprint != b.fingerprint:
            return name
    if old.runtime == "tflite" and (old.ops != new.ops or old.placement != new.placement):
        return "delegation"
    if old.runtime == "ethos-u" and ([n[1:] for n in old.nodes] != [n[1:] for n in new.nodes]):
        return "placement"
    if old.runtime == "tvm":
        i = first_pass_difference(old.passes, new.passes)
        if i is not None:
            name = (old.passes[i] if i < len(old.passes) else new.passes[i])["name"]
            return f"pass {name} (#{i})"
    return None


def level_differences(old: RuntimeGraph, new: RuntimeGraph) -> dict[str, dict]:
    """Per level: which fingerprint parts are the same, and the op-count deltas."""
    out = {}
    for name in LEVELS:
        a, b = old.levels.get(name), new.levels.get(name)
        if a is None or b is None:
            continue
        ops = {op: {"old": a.ops.get(op, 0), "new": b.ops.get(op, 0), "delta": b.ops.get(op, 0) - a.ops.get(op, 0)}
               for op in sorted(set(a.ops) | set(b.ops)) if a.ops.get(op, 0) != b.ops.get(op, 0)}
        same = {part: getattr(a.fingerprint, part) == getattr(b.fingerprint, part)
                for part in ("structure", "weights", "quantization")}
        out[name] = {"same": same, "op_counts": ops}
    return out
