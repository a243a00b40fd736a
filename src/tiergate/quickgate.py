"""The decision cache's fast path: an unchanged `tiergate gate` answered before anything heavy runs.

The normal path of an unchanged re-run loads and lints every artifact (onnx, onnxruntime),
asks Docker for its images and the runtime graphs, finds every run in the run cache and
then the decision in the decision cache. This module answers the same re-run from one file,
importing no numpy, scipy, onnx, onnxruntime, docker, prefect or sqlalchemy:

- `remember(request, build, gate_run, recorder)` after the normal path: under
  `TIERGATE_HOME/quick/<request key>.json` it writes which decision file answered, the run
  folders and images it was made from, and the candidate's runtime graphs and findings;
- `lookup(request, build) -> GateRun | None` before it: the request key is a sha256 over cheap
  identities of everything the decision depends on (see `identity`); the answer is given
  only when the decision file still verifies (schema, key, the inputs it names), every run
  folder it names still has the same result.json and its outputs still hash to what the
  result says (or every file of it is as it was when `remember` verified it: state.stamps),
  every artifact still hashes (with its ONNX external data) to what intake found, and the
  Docker engine (asked over its unix socket with http.client, not the docker SDK) still has
  the artifact, runtime and base images with the same ids.

Anything in doubt answers None and the normal path runs (it is always correct). There is no
fast path for a loader FILE.py:FUNCTION as --data (its output is only known by running it),
with a registry (the CLI skips it: the registry records the decision), or when a device class
uses an engine other than the local one (docker_host other than "local", or DOCKER_HOST other
than a unix socket). Options that do not change a decision (--max-parallel) are not in the key.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import http.client
import json
import os
import socket
import zipfile
from pathlib import Path
from urllib.parse import quote

from tiergate import state
from tiergate.state import stamps
from tiergate.decision import Decision, GateRun
from tiergate.hashing import metric_code_sha256, read_external
from tiergate.images import DESCRIBE_FILE, DESCRIBER, ENGINE_TIMEOUT_S, HOST_CA_BUNDLE, HOST_PIP_CONF, LABEL
from tiergate.paths import containers_dir
from tiergate.request import BuildSettings, GateRequest, candidate_class, is_loader

SCHEMA = 3        # 2: every run the decision names is verified (an early decision's chunks too); 3: with its
                  # folder's stamps, and the data by its side file
DEFAULT_SOCKET = "/var/run/docker.sock"
PACKAGE = Path(__file__).resolve().parent


class NoFastPath(Exception):
    """This request has no fast path (say why); the normal path answers it."""


class StoredFinding:
    """A lint finding as it was saved (Finding.to_json()): what the CLI prints and writes of it."""

    def __init__(self, data: dict):
        self._data = dict(data)

    def __getattr__(self, name: str):
        try:
            return self.__dict__["_data"][name]
        except KeyError:
            raise AttributeError(name) from None

    def to_json(self) -> dict:
        return dict(self._data)


class Recorder:
    """A builder that keeps what each build returned (device class, artifact sha256) -> BuiltImage,
    for `remember`; everything else (describe) is the wrapped builder's."""

    def __init__(self, builder):
        self.builder = builder
        self.images: dict[tuple[str, str], object] = {}

    def build(self, device_class, intake):
        image = self.builder.build(device_class, intake)
        self.images[(device_class.name, intake.sha256)] = image
        return image

    def __getattr__(self, name: str):
        return getattr(self.__dict__["builder"], name)


# --- the request key ---------------------------------------------------------------------------


def identity(request: GateRequest, build: BuildSettings) -> tuple[dict, dict[str, str]]:
    """(what the request key hashes, per role the sha256 of the artifact file's own bytes).

    Artifacts and data by content (a labels side file the archive names too), device classes and policy by their
    dataclass content (as the decision cache hashes them), --metric names (and FILE.py content), --sample-axis,
    --base-image, the --ca-bundle content, --profile, the containers/ folder (recipe, locks, harness), the host's
    pip.conf and CA bundle (both go into the runtime image tag), DOCKER_HOST and the source of the whole tiergate
    package. A file still since it was last hashed is known by its stamp (state.stamps), not read again.
    NoFastPath when a part cannot be known cheaply.
    """
    _engine_socket(request.device_classes)
    if is_loader(request.data):
        raise NoFastPath("the data is a loader FILE.py:FUNCTION")
    known = stamps.KnownHashes()
    files = {}
    for role, path in request.artifacts.items():
        files[role] = _file_sha(path, required=True, known=known)
    metrics = []
    for name in request.metrics:
        file = name.rpartition(":")[0] if is_loader(name) else ""
        metrics.append([name, _file_sha(Path(file), required=True, known=known) if file else ""])
    side = labels_side_file(Path(request.data))
    policy = request.policy
    doc = {
        "schema": SCHEMA,
        "artifacts": dict(files),
        "data": _file_sha(Path(request.data), required=True, known=known),
        "labels_file": None if side is None else _file_sha(side, required=True, known=known),
        "device_classes": state.classes_identity(request.device_classes),
        "policy": state.policy_identity(policy),          # the decision's own identities (state), and early stop's
        "policy_early": json.dumps(policy.early, sort_keys=True, default=str),
        "early_stop": request.early_stop,
        "metrics": metrics,
        "sample_axes": list(request.sample_axes),
        "base_image": build.base_image,
        "ca_bundle": None if build.ca_bundle is None else _file_sha(Path(build.ca_bundle), required=True),
        "profile": bool(request.profile),
        "disabled_passes": list(request.disabled_passes),
        "containers": tree_sha256(containers_dir()),
        "pip_conf": _file_sha(HOST_PIP_CONF),
        "host_ca": _file_sha(HOST_CA_BUNDLE),
        "docker_host": os.environ.get("DOCKER_HOST", ""),
        "code": tree_sha256(PACKAGE),
    }
    known.save()
    return doc, files


def request_key(request: GateRequest, build: BuildSettings = BuildSettings()) -> str:
    return _key_of(identity(request, build)[0])


def _key_of(doc: dict) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def tree_sha256(root: Path) -> str:
    """One hash over a folder: every file's relative path and content (no __pycache__, no .pyc)."""
    digest = hashlib.sha256()
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".pyc"):
                continue
            path = Path(folder) / name
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def _file_sha(path: Path, *, required: bool = False, known: stamps.KnownHashes | None = None) -> str | None:
    if not path.is_file():
        if required:
            raise NoFastPath(f"{path}: no such file")
        return None
    if known is not None:
        return known.sha256(path)
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def labels_side_file(archive: Path) -> Path | None:
    """The labels side file an evaluation archive names (its `labels` member a 0-d string: tiergate.labels), read
    from the .npz's zip without numpy; None when it names none. NoFastPath when the member cannot be read here.
    Read once per archive and stamp (a lookup asks for it twice: the key, and the files it watches)."""
    return _side_file(archive, tuple(stamps.stamp(archive) or ()))


@functools.lru_cache(maxsize=8)
def _side_file(archive: Path, _stamp: tuple) -> Path | None:
    if not zipfile.is_zipfile(archive):
        return None                 # not an .npz: intake says so (and the key has its bytes)
    try:
        with zipfile.ZipFile(archive) as npz:
            if "labels.npy" not in npz.namelist():
                return None
            with npz.open("labels.npy") as member:
                head = member.read(10)
                if head[:6] != b"\x93NUMPY":
                    raise NoFastPath(f"{archive}: its labels are not a .npy member")
                size = int.from_bytes(head[8:10], "little") if head[6] == 1 else \
                    int.from_bytes(head[8:10] + member.read(2), "little")
                header = ast.literal_eval(member.read(size).decode("latin1"))
                descr, shape = header["descr"], tuple(header["shape"])
                if shape != () or not isinstance(descr, str) or descr[1:2] != "U":
                    return None             # numbers or texts in the archive itself (its hash covers them)
                name = member.read(4 * int(descr[2:])).decode("utf-32-le" if descr[0] != ">" else "utf-32-be")
    except NoFastPath:
        raise
    except Exception as exc:  # noqa: BLE001 - intake reads it and says what is wrong; no fast path meanwhile
        raise NoFastPath(f"{archive}: {exc}") from None
    name = name.rstrip("\0")
    return archive.parent / name if not Path(name).is_absolute() else Path(name)


def _engine_socket(device_classes) -> str:
    """The local engine's unix socket; NoFastPath for any other engine."""
    if any((dc.docker_host or "local") != "local" for dc in device_classes):
        raise NoFastPath("a device class uses another Docker engine than the local one")
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        return DEFAULT_SOCKET
    if host.startswith("unix://"):
        return host[len("unix://"):]
    raise NoFastPath(f"DOCKER_HOST={host} is not a unix socket")


def artifact_sha256(file_sha: str, path: Path, external: list[str]) -> str:
    """The artifact's sha256 as intake computes it: the file's bytes (`file_sha` when it has no external data),
    then every external data file's location and bytes, sorted (hashing.read_external); a location intake refuses
    has no fast path."""
    if not external:
        return file_sha
    with open(path, "rb") as stream:
        digest = hashlib.file_digest(stream, "sha256")
    try:
        read_external(path, external, digest)
    except Exception as exc:  # noqa: BLE001 - InputError: intake refuses it, and says why
        raise NoFastPath(f"{path}: external data: {exc}") from None
    return digest.hexdigest()


# --- the Docker engine, over its socket ---------------------------------------------------------


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


def image_ids(names, socket_path: str, *, labels: bool = False) -> dict[str, object]:
    """name -> its image id on the engine (None when it has none); with labels: name -> (id, labels)."""
    found: dict[str, object] = {}
    conn = _UnixConnection(socket_path, ENGINE_TIMEOUT_S)
    try:
        for name in dict.fromkeys(names):
            conn.request("GET", f"/images/{quote(name, safe='/:@')}/json")
            response = conn.getresponse()
            body = response.read()
            if response.status == 404:
                found[name] = None
                continue
            if response.status != 200:
                raise NoFastPath(f"the engine answered {response.status} for {name}")
            doc = json.loads(body)
            found[name] = (doc["Id"], (doc.get("Config") or {}).get("Labels") or {}) if labels else doc["Id"]
    finally:
        conn.close()
    return found


# --- lookup and remember -------------------------------------------------------------------------


def _images_unchanged(wanted: dict[str, str | None], request: GateRequest) -> dict[str, str]:
    """name -> id of every wanted image on the engine, each with the id wanted (None: any id); NoFastPath naming
    the first that is gone or now another image."""
    current = image_ids(wanted, _engine_socket(request.device_classes))
    for name, image_id in wanted.items():
        now = current.get(name)
        if now is None or (image_id is not None and now != image_id):
            raise NoFastPath(f"the image {name} ({(image_id or 'any id')[:19]}) is "
                             f"{'gone' if now is None else 'now ' + now[:19]} on the engine")
    return current


def lookup(request: GateRequest, build: BuildSettings = BuildSettings()) -> GateRun | None:
    """The decision of an unchanged request, verified, or None (the normal path then runs)."""
    MISSED_WHY[:] = []
    try:
        return _lookup(request, build)
    except NoFastPath as exc:
        MISSED_WHY[:] = [str(exc)]
        return None
    except Exception as exc:  # noqa: BLE001 - any doubt: the normal path answers (and is always right)
        if os.environ.get("TIERGATE_DEBUG"):
            raise
        MISSED_WHY[:] = [f"{type(exc).__name__}: {exc}"]
        return None


# Why the last `lookup` did not answer (one line, or empty), as DECLINED for `remember`: for a person or a test
# asking why a gate took the normal path; the gate itself never depends on it.
MISSED_WHY: list[str] = []


# The identity a lookup that missed computed, handed to the same request's next step: the typer command's lookup
# after cli/fastgate.py's, then `remember` after the normal path. The files are hashed once per gate, not once per
# step. It is used once, only while every file it hashed has the same size, mtime and inode, and `remember` still
# saves nothing unless intake's artifact hashes and the decision's data hash are the ones it names.
_MISSED: list = []


def _file_stats(request: GateRequest) -> tuple:
    paths = [*request.artifacts.values(), Path(request.data)]
    side = None if is_loader(request.data) else labels_side_file(Path(request.data))
    paths += [side] if side is not None else []
    try:
        return tuple((str(p), *stamps.stamp(p)) for p in paths)
    except TypeError:
        raise NoFastPath("a file the request names is not a regular file") from None


def _identity_once(request: GateRequest, build: BuildSettings) -> tuple[dict, dict, tuple]:
    """(doc, hashers, file stats): the missed lookup's when it is this request's and no file changed since."""
    last, _MISSED[:] = list(_MISSED), []
    stats = _file_stats(request)
    if len(last) == 5 and last[0] == request and last[1] == build and last[4] == stats:
        doc, hashers = last[2], last[3]
    else:
        doc, hashers = identity(request, build)
    return doc, hashers, stats


def _missed(request: GateRequest, build: BuildSettings, doc: dict, hashers: dict, stats: tuple) -> None:
    _MISSED[:] = [request, build, doc, dict(hashers), stats]


def _lookup(request: GateRequest, build: BuildSettings) -> GateRun:
    doc, hashers, stats = _identity_once(request, build)
    _missed(request, build, doc, hashers, stats)     # until it answers below
    run = _answer(request, build, doc, hashers)
    _MISSED[:] = []
    return run


def _answer(request: GateRequest, build: BuildSettings, doc: dict, hashers: dict) -> GateRun:
    key = _key_of(doc)
    entry = state.read_quick_entry(key)         # sealed: an edited or foreign entry is never believed
    if entry is None or entry.get("schema") != SCHEMA or entry.get("key") != key:
        raise NoFastPath("no entry for this request" if entry is None else "the entry is of another schema or key")
    inputs = entry["decision_inputs"]
    if not _inputs_match_request(inputs, request):
        raise NoFastPath("the classes, policy or metrics differ from the decision's")
    if set(entry["artifacts"]) != set(request.artifacts):
        raise NoFastPath("the request names other artifacts")
    for role, path in request.artifacts.items():
        known = entry["artifacts"][role]
        if artifact_sha256(hashers[role], path, known["external"]) != known["sha256"] \
                or inputs.get(role) != known["sha256"]:
            raise NoFastPath(f"the {role} changed")
    decision = _saved_decision(entry["decision_key"], inputs)
    if decision is None:
        raise NoFastPath("the decision cache file does not verify")
    runs = {(role, dc): Path(folder) for role, dc, folder in entry["runs"]}
    named = {label: (Path(folder), seen) for label, folder, seen in entry["verify"]}
    if set(named) != set(inputs["runs"]) or not set(f"{role}/{dc}" for role, dc in runs) <= set(named):
        raise NoFastPath("the entry names other runs than the decision")
    for label, (folder, seen) in named.items():
        if not _still_verified(folder, seen, inputs, label):
            raise NoFastPath(f"the run {label} no longer verifies")
    _images_unchanged(entry["images"], request)
    if not all(state.folder_verifies(Path(folder)) for folder in entry["runtime_graph_folders"]):
        # the normal path would describe again: its runtime section would differ
        raise NoFastPath("a runtime graph is no longer in the describe cache")
    findings = {dc: [StoredFinding(f) for f in found] for dc, found in entry["findings"].items()}
    hashes = {role: entry["artifacts"][role]["sha256"] for role in request.artifacts}
    return GateRun(decision, runs, cache_hits=entry["cache_hits"], decision_cached=True,
                   decision_key=entry["decision_key"],
                   runtime=entry["runtime"], runtime_findings=findings, hashes=hashes)


def _still_verified(folder: Path, seen: dict | None, inputs: dict, label: str) -> bool:
    """The run the decision names is still in its folder and verifies: every file as it was when `remember`
    verified it in full (its stamps, state.stamps), else verified in full again (its outputs hashed, its seal)."""
    if seen is not None and folder.parent == state.runs_root() and stamps.folder_stamp(folder) == seen:
        return True
    return state.run_matches(folder, inputs, label)


def _inputs_match_request(inputs: dict, request: GateRequest) -> bool:
    """The decision's inputs are what this request computes, not only what the entry says: its classes and
    policy by content, and every metric it names (user metrics by their code: metric_code_matches)."""
    computed = {"device_classes": state.classes_identity(request.device_classes),
                "policy": state.policy_identity(request.policy)}
    if any(name in inputs and inputs[name] != value for name, value in computed.items()):
        return False
    if "metrics" in inputs and not metric_code_matches(inputs["metrics"], request):
        return False
    return True


def metric_code_matches(identities: list, request: GateRequest) -> bool:
    """Every user metric of the request is among the decision's metrics, and its file, the local modules it
    imported and its folder still hash as they did (hashing.metric_code_sha256)."""
    custom = {}
    for text in identities:
        spec = json.loads(text)
        if spec.get("kind") == "custom":
            custom[spec.get("source")] = spec
    for name in request.metrics:
        if not is_loader(name):
            continue
        spec = custom.get(name)
        if spec is None:
            return False
        file = Path(name.rpartition(":")[0])
        if _file_sha(file, required=True) != spec.get("source_sha256"):
            return False
        if metric_code_sha256(file, spec.get("code_files") or ()) != spec.get("code_sha256"):
            return False
    return True


def _saved_decision(key: str, inputs: dict) -> Decision | None:
    """The decision cache file, when it verifies (state.read_decision)."""
    doc = state.read_decision(key, inputs)
    return None if doc is None else Decision.from_json(doc)


# Why the last `remember` saved nothing (one line, or empty): for a person or a test asking why a gate was not
# remembered; the gate itself never depends on it.
DECLINED: list[str] = []


def remember(request: GateRequest, build: BuildSettings, gate_run, recorder: Recorder) -> Path | None:
    """After the normal path: save what `lookup` needs to answer this request next time (or nothing, when
    some part cannot be verified later). `recorder`: the Recorder that wrapped this gate's builder."""
    DECLINED[:] = []
    try:
        saved = _remember(request, build, gate_run, recorder)
    except NoFastPath as exc:
        DECLINED[:] = [str(exc)]
        return None
    except Exception as exc:  # noqa: BLE001 - the gate has answered; a fast path is only an optimisation
        if os.environ.get("TIERGATE_DEBUG"):
            raise
        DECLINED[:] = [f"{type(exc).__name__}: {exc}"]
        return None
    if saved is None:
        DECLINED[:] = ["no usable cache key: nothing is sealed"]
    return saved


def _remember(request: GateRequest, build: BuildSettings, gate_run, recorder: Recorder) -> Path | None:
    if not gate_run.decision_key or not gate_run.run_dirs:
        raise NoFastPath("decided before anything ran (never cached)")     # e.g. a signature difference
    doc, hashers, _ = _identity_once(request, build)      # its lookup hashed the files already
    key = _key_of(doc)
    inputs = json.loads(state.decision_path(gate_run.decision_key).read_text())["inputs"]
    origin = gate_run.data_origin
    if inputs.get("data") != origin.get("archive") or origin.get("data") != doc["data"] \
            or origin.get("labels_file") != doc["labels_file"]:
        raise NoFastPath("the data changed while the gate ran")     # its key would name other data
    decision = _saved_decision(gate_run.decision_key, inputs)
    if decision is None or decision.dumps() != gate_run.decision.dumps():
        raise NoFastPath("the saved decision is not the gate's" if decision is not None else
                         "the decision cache file does not verify")
    artifacts = {}
    for role, path in request.artifacts.items():
        intake = gate_run.intakes[role]
        external = list(intake.artifact.external_data or ())
        sha = artifact_sha256(hashers[role], path, external)
        if sha != intake.sha256 or inputs.get(role) != sha:
            raise NoFastPath(f"the {role} changed while the gate ran")
        artifacts[role] = {"sha256": sha, "external": external}
    runs, named, wanted = _runs_and_images(gate_run, inputs, recorder)
    current = _images_unchanged(wanted, request)
    runtime, findings, graphs = _runtime_as_cached(request, gate_run, recorder)
    entry = {
        "schema": SCHEMA, "key": key, "created_at": state.now_iso(),
        "request": doc, "artifacts": artifacts, "decision_key": gate_run.decision_key,
        "decision_inputs": inputs, "runs": runs, "verify": named, "images": current,
        "runtime_graph_folders": graphs, "runtime": runtime, "findings": findings,
        # what the normal path's re-run finds in the run cache: every run this gate made or reused (an early
        # decision's chunk runs too)
        "cache_hits": gate_run.cache_hits + gate_run.containers_started,
    }
    return state.save_quick_entry(key, entry)


def _runs_and_images(gate_run, inputs: dict, recorder: Recorder) -> tuple[list, list, dict]:
    """(the gate's run folders, every run the decision names with its folder, the images an answer must find
    unchanged). The decision names more runs than the gate's folders where it was made in looks: each chunk's run
    and the merged prefix a look was judged on ("role/class/chunk-2"); each must still be the one it names."""
    runs, named, wanted = [], [], {}
    mark = stamps.clock_mark()          # the file system's time before any folder is stamped (stamps.changed_before)
    for (role, dc), folder in gate_run.run_dirs.items():
        runs.append([role, dc, str(folder)])
    for label, text in inputs["runs"].items():
        role, where = label.split("/", 1)
        dc = where.split("/", 1)[0]
        folder = state.runs_root() / text.rpartition(":")[0]
        image = recorder.images.get((dc, gate_run.intakes[role].sha256)) if role in gate_run.intakes else None
        before = stamps.believed_folder_stamp(folder, mark)
        if image is None or not state.run_matches(folder, inputs, label) \
                or inputs["images"].get(label) != image.image_id:
            raise NoFastPath(f"the run {label} cannot be verified later")
        after = stamps.folder_stamp(folder)
        believed = stamps.changed_before(before, mark) or stamps.folder_settled(before)
        named.append([label, str(folder), before if before == after and believed else None])
        wanted[image.tag] = image.image_id
        wanted[image.runtime_tag] = None
        wanted[image.labels[f"{LABEL}.base_image"]] = None
    if not {f"{role}/{dc}" for role, dc, _ in runs} <= {label for label, *_ in named}:
        raise NoFastPath("the decision names other runs")
    return runs, named, wanted


def _runtime_as_cached(request: GateRequest, gate_run, recorder: Recorder):
    """The candidate's runtime graphs and findings as the next normal run prints them: from the candidate's run
    folder where its run described it (the folder is a run the answer verifies anyway), else from the describe
    cache (its `cached` and `seconds` say so), with the cache folders that must still be there."""
    runtime, findings, graphs = {}, {}, []
    candidate = gate_run.intakes["candidate"]
    describer = _file_sha(containers_dir() / DESCRIBER) or ""
    for dc in request.device_classes:
        if dc.name not in gate_run.runtime:
            continue
        image = recorder.images[(dc.name, candidate.sha256)]
        folder = gate_run.run_dirs.get(("candidate", dc.name))
        if folder is not None and (Path(folder) / DESCRIBE_FILE).is_file():
            # described by the candidate's run (orchestrator.describing.from_run): a re-run reads the same graph
            # from the cached run folder, which the answer verifies as a run
            runtime[dc.name] = {**gate_run.runtime[dc.name], "cached": True}
            findings[dc.name] = [f.to_json() for f in gate_run.runtime_findings.get(dc.name, [])]
            continue
        own = candidate_class(dc, request)             # the class the candidate ran on (--disable-pass)
        graph, found = recorder.builder.describe(own, candidate, image)
        folder = state.graph_folder(candidate.sha256, graph.get("image_id", ""), describer, own.graph_key)
        if graph.get("cached") is not True or not state.folder_verifies(folder):
            raise NoFastPath(f"the runtime graph on {dc.name} is not in the describe cache")
        runtime[dc.name] = graph
        findings[dc.name] = [f.to_json() for f in found]
        graphs.append(str(folder))
    if list(runtime) != list(gate_run.runtime):
        raise NoFastPath("the runtime graphs differ from the gate's")
    return runtime, findings, graphs
