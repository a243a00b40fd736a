"""The MLflow bridge: artifacts from MLflow's model registry, verdicts and promotions back to it (docs/mlflow.md).

- `models:/NAME/VERSION` and `models:/NAME@ALIAS` name an artifact in MLflow's model registry (the one given by
  MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI, as MLflow reads them). `fetch(uri)` resolves an alias to its
  version every time (aliases move), and downloads a version's files once: cached under the home
  (`state.mlflow_folder`, keyed by what the version IS, not by how it was named: the resolved stores (a relative
  `sqlite:///mlflow.db` made absolute, links resolved), the name, the version and the version's own identity in
  MLflow (run id, source, creation time, model id), with a sealed manifest and that identity checked on every use).
  The model file is the one .onnx or .tflite file of the logged model's folder (ONNX external data beside it); it
  then goes through the normal intake like any file. A reference must be FP32 (artifact.precision).
- A store that is not there (a sqlite file or a store folder that does not exist) is refused before MLflow is
  asked: MLflow would create an empty one (a folder and a database) on a mistyped URI.
- `write_back(...)` after a gate: version tags `tiergate.verdict`, `tiergate.decision_sha256`, one
  `tiergate.<device class>.<check>` per failing check, `tiergate.report`; `--mlflow-promote ALIAS` moves the
  alias to the candidate's version on PROMOTE only.
- `new_versions(name)` (the Prefect watcher, tiergate.orchestration.mlflow_watch): the versions of a registered
  model newer than the last one seen, that state kept under the home, written atomically.

Every MLflow error (an unreachable store, an unknown model, alias or version) is one line (exit 2); MLflow's own
loggers are silenced (its tracebacks never reach the terminal: the error is ours, once). MLflow is imported inside
the functions that need it (about 1.5 s); `is_model_uri`, `parse_uri` and `store_identity` are stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from tiergate.errors import EnvironmentProblem, InputError
from tiergate.registry.masking import masked, masked_text

PREFIX = "models:/"
ROLES = ("candidate", "reference", "incumbent")
TAG_PREFIX = "tiergate."
MAX_TAG_KEY = 250            # MLflow's limit on a tag key
MAX_TAG_VALUE = 500          # a short reason (MLflow allows 5000 characters; a UI shows far fewer)
FORMATS = (".onnx", ".tflite")
_NAME = re.compile(r"^[^/@]+$")
_ALIAS = re.compile(r"^[A-Za-z0-9_-]+$")
_VERSION = re.compile(r"^[0-9]{1,18}$")          # ASCII digits only (str.isdigit takes '²' and '٣')
IDENTITY_FILE = "identity.json"                  # in a cache folder: the version it holds (sealed with its files)
_TAG_KEY_BAD = re.compile(r"[^A-Za-z0-9_.\- /]")


@dataclass(frozen=True)
class ModelRef:
    """A parsed `models:/NAME/VERSION` or `models:/NAME@ALIAS`."""

    name: str
    version: str | None = None
    alias: str | None = None

    @property
    def uri(self) -> str:
        return f"{PREFIX}{self.name}" + (f"@{self.alias}" if self.alias else f"/{self.version}")


@dataclass(frozen=True)
class Source:
    """An artifact fetched from MLflow: its identity (the lineage) and the local model file."""

    uri: str                     # as given
    name: str
    version: str
    alias: str | None
    run_id: str | None
    source: str                  # the version's source (masked)
    tracking_uri: str            # the store, resolved (store_identity), masked of secrets
    registry_uri: str            # the same of the registry
    path: Path                   # the model file in the cache
    sha256: str = ""             # the model file's own sha256 as downloaded

    def lineage(self) -> dict:
        doc = {k: v for k, v in asdict(self).items() if k != "path" and not (k == "sha256" and not v)}
        doc["file"] = self.path.name
        return doc


def is_model_uri(value) -> bool:
    return value is not None and str(value).startswith("models:")


def parse_uri(value) -> ModelRef:
    """`models:/NAME/VERSION` or `models:/NAME@ALIAS` (InputError for anything else)."""
    text = str(value)
    if not text.startswith(PREFIX) or text.startswith(PREFIX + "/"):
        raise InputError(f"{text}: an MLflow model URI is models:/NAME/VERSION or models:/NAME@ALIAS")
    body = text[len(PREFIX):]
    if "@" in body:
        name, _, alias = body.rpartition("@")
        if _NAME.match(name) and _ALIAS.match(alias):
            return ModelRef(name, alias=alias)
    else:
        name, _, version = body.rpartition("/")
        if name and _NAME.match(name) and _VERSION.match(version):
            return ModelRef(name, version=str(int(version)))
    raise InputError(f"{text}: an MLflow model URI is models:/NAME/VERSION (a version number) or "
                     "models:/NAME@ALIAS (letters, digits, '_', '-')")


def check_alias(alias: str) -> str:
    """An alias --mlflow-promote may move (MLflow refuses 'latest' and 'v<digits>')."""
    if not _ALIAS.match(alias) or alias.lower() == "latest" or re.fullmatch(r"[vV]\d+", alias):
        raise InputError(f"--mlflow-promote {alias}: an alias is letters, digits, '_' and '-', "
                         "not 'latest' nor v<number>")
    return alias


# --- MLflow access -----------------------------------------------------------------------------------------


def _client():
    """An MlflowClient of the configured tracking and registry URIs (HTTP retries kept short: one line soon), once
    both stores are known to be there (store_problem)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        import mlflow
        from mlflow import MlflowClient

        quiet()
        tracking, registry = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    except Exception as exc:  # noqa: BLE001 - an unusable URI: one line
        raise problem("MLflow", exc) from None
    for variable, uri in (("MLFLOW_TRACKING_URI", tracking), ("MLFLOW_REGISTRY_URI", registry)):
        why = store_problem(uri)
        if why:
            unset = "" if os.environ.get(variable) else " (not set: MLflow's default)"
            raise EnvironmentProblem(f"{variable} {masked(uri)}{unset}: {why}",
                                     hint="point it at an existing MLflow store; tiergate never creates one")
    try:       # by the resolved stores: MLflow caches a store per URI text, in this process (a relative one too)
        return MlflowClient(store_identity(tracking), store_identity(registry))
    except Exception as exc:  # noqa: BLE001 - an unusable URI: one line
        raise problem("MLflow", exc) from None


def quiet() -> None:
    """MLflow's own loggers (and the database migrations' under it) print nothing: every MLflow error reaches the
    user once, as tiergate's one line (its logger would print the traceback of a failed write first)."""
    import logging

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def _store_path(uri: str) -> tuple[str, str] | None:
    """(kind, local path) of a store that lives in a local file or folder: ("sqlite", db file) or ("file", folder);
    None for any other store (a server, a database server, an in-memory SQLite)."""
    text = str(uri)
    if text.lower().startswith("sqlite:"):
        rest = text[len("sqlite:"):]
        if not rest.startswith("///"):
            return None                                   # sqlite:// (in memory)
        path = unquote(rest[3:].split("?", 1)[0])
        return None if path in ("", ":memory:") else ("sqlite", path)
    parsed = urlparse(text)
    if parsed.scheme == "file":
        return "file", unquote(parsed.path)
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):
        return "file", text
    return None


def store_identity(uri: str) -> str:
    """The store a tracking or registry URI names, as one spelling: a local SQLite file or store folder by its
    absolute, link-resolved path (`sqlite:///mlflow.db` in two projects is two stores; two spellings of one file
    are one); any other URI as given (a server's URL names it already)."""
    local = _store_path(uri)
    if local is None:
        return str(uri)
    kind, path = local
    resolved = os.path.realpath(path)
    query = str(uri).split("?", 1)[1] if kind == "sqlite" and "?" in str(uri) else ""
    return (f"sqlite:///{resolved}" + (f"?{query}" if query else "")) if kind == "sqlite" else f"file://{resolved}"


def store_problem(uri: str) -> str | None:
    """Why a local store is not there (MLflow would create an empty one: a folder and a ~1 MB database), or None."""
    local = _store_path(uri)
    if local is None:
        return None
    kind, path = local
    if kind == "sqlite":
        if not os.path.exists(path):
            return f"no MLflow database at {path} (MLflow would create an empty store there)"
        if not os.path.isfile(path):
            return f"{path} is not a database file"
        return None
    if not os.path.isdir(path):
        return f"no MLflow store folder at {path} (MLflow would create an empty one)"
    return None


def problem(what: str, exc: BaseException) -> EnvironmentProblem:
    """An MLflow error as one line: not found is the user's input (InputError), the rest the environment."""
    message = " ".join(masked_text(getattr(exc, "message", None) or str(exc) or type(exc).__name__).split())
    if len(message) > 300:
        message = message[:300] + " ..."
    code = getattr(exc, "error_code", "")
    if code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
        return InputError(f"{what}: {message}")
    return EnvironmentProblem(f"{what}: MLflow: {message}",
                              hint="check MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI and that the store is reachable")


def _uris(client) -> tuple[str, str]:
    return str(client._tracking_client.tracking_uri), str(client._registry_uri)


def fetch(uri: str, client=None) -> Source:
    """The model version a URI names (an alias resolved now), its files fetched once into the home's cache."""
    from tiergate.hashing import file_sha256

    ref = parse_uri(uri)
    client = client or _client()
    try:
        if ref.alias:
            version = client.get_model_version_by_alias(ref.name, ref.alias)
        else:
            version = client.get_model_version(ref.name, ref.version)
    except Exception as exc:  # noqa: BLE001 - MlflowException, a connection error: one line
        raise problem(uri, exc) from None
    tracking, registry = _uris(client)
    identity = version_identity(version, ref.name, tracking, registry)
    folder = _download(client, ref.name, str(version.version), identity, uri)
    path = model_file(folder, uri)
    return Source(str(uri), ref.name, str(version.version), ref.alias, version.run_id or None,
                  masked(version.source or ""), masked(identity["store"]), masked(identity["registry"]), path,
                  file_sha256(path))


def version_identity(version, name: str, tracking: str, registry: str) -> dict:
    """What a model version IS, for the download cache: the resolved stores, the name and number, and the version's
    own record in MLflow (run id, source, creation time, model id): a version deleted and registered again, or
    the same name and number in another store, is another identity."""
    return {"store": store_identity(tracking), "registry": store_identity(registry), "name": name,
            "version": str(version.version), "run_id": version.run_id or "", "source": version.source or "",
            "created": version.creation_timestamp, "model_id": getattr(version, "model_id", None) or ""}


def cache_key(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _holds(folder: Path, key: str) -> bool:
    """The cached folder says (in its sealed identity file) it holds the version of this key."""
    try:
        return json.loads((folder / IDENTITY_FILE).read_text()).get("key") == key
    except (OSError, ValueError, AttributeError):
        return False


def _download(client, name: str, version: str, identity: dict, uri: str) -> Path:
    from tiergate import state

    key = cache_key(identity)
    folder = state.mlflow_folder(key)
    if state.cached_folder(folder, f"MLflow model {name}/{version}"):
        if _holds(folder, key):
            return folder / "files"
        state.discard_folder(folder, f"MLflow model {name}/{version}", "it holds another version than MLflow names")
    work = state.part_path(folder)
    shutil.rmtree(work, ignore_errors=True)
    (work / "files").mkdir(parents=True)
    try:
        from mlflow.artifacts import download_artifacts

        download_uri = client.get_model_version_download_uri(name, version)
        download_artifacts(artifact_uri=download_uri, dst_path=str(work / "files"), tracking_uri=identity["store"])
    except Exception as exc:  # noqa: BLE001 - one line
        _discard_part(work)
        raise problem(f"{uri}: downloading {name}/{version}", exc) from None
    try:
        found = model_file(work / "files", uri)  # refuse a folder with no model (or several) before caching it
        from tiergate.artifact import load_artifact

        shown = {k: masked(v) if isinstance(v, str) else v for k, v in identity.items()}
        (work / IDENTITY_FILE).write_text(json.dumps(      # the artifact's intake hash: what gc's keep rules name
            {"key": key, **shown, "artifact_sha256": load_artifact(found).sha256}, indent=1, sort_keys=True))
        state.publish_folder(work, folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return folder / "files"


def _discard_part(work: Path, settle_s: float = 0.5, most_s: float = 15.0) -> None:
    """Remove a failed download's part folder for good: MLflow raises from its listing while the copies it already
    handed to its thread pool go on writing, so the folder is removed again until it stays gone for `settle_s`."""
    import time

    deadline, gone_since = time.monotonic() + most_s, None
    while time.monotonic() < deadline:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
            gone_since = None
        elif gone_since is None:
            gone_since = time.monotonic()
        elif time.monotonic() - gone_since >= settle_s:
            return
        time.sleep(0.05)


def model_file(folder: Path, uri: str) -> Path:
    """The one .onnx or .tflite file of a logged model's folder (its ONNX external data lies beside it)."""
    found = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in FORMATS)
    if len(found) != 1:
        listed = ", ".join(p.relative_to(folder).as_posix() for p in found[:5])
        what = "no .onnx or .tflite file" if not found else f"{len(found)} model files ({listed})"
        raise InputError(f"{uri}: the model version holds {what}; tiergate gates one ONNX or TFLite file")
    return found[0]


def fetch_values(values: dict) -> tuple[dict, dict[str, Source]]:
    """The gate's option values with every models:/ artifact replaced by its fetched file, and those sources
    by role. --mlflow-promote needs an MLflow candidate (checked before anything is fetched)."""
    promote = values.get("mlflow_promote")
    if promote is not None:
        if not is_model_uri(values.get("candidate")):
            raise InputError("--mlflow-promote needs an MLflow candidate (-c models:/NAME/VERSION or models:/NAME@ALIAS)")
        check_alias(promote)
        reference = values.get("reference")
        if is_model_uri(reference) and parse_uri(reference).alias == promote:
            raise InputError(f"--mlflow-promote {promote}: is the reference's own alias ({reference}); a PROMOTE "
                             "would move it to the candidate and the next gate would take a quantized model as its "
                             "FP32 reference: promote to another alias (e.g. -r models:/NAME@fp32 --mlflow-promote "
                             "champion)")
    roles = [role for role in ROLES if is_model_uri(values.get(role))]
    if not roles:
        return values, {}
    for role in roles:
        parse_uri(values[role])
    client = _client()
    sources = {role: fetch(str(values[role]), client) for role in roles}
    if "reference" in sources:
        check_fp32(sources["reference"])
        if promote is not None and sources["candidate"].name == sources["reference"].name:
            _check_promote_target(client, promote, sources["reference"])
    return values | {role: s.path for role, s in sources.items()}, sources


def _check_promote_target(client, alias: str, reference: Source) -> None:
    """--mlflow-promote ALIAS where ALIAS names the reference's version now (given by number): refused as the
    reference's own alias is (a PROMOTE would move the FP32 reference's alias onto the candidate)."""
    try:
        current = client.get_model_version_by_alias(reference.name, alias)
    except Exception:  # noqa: BLE001 - the alias names nothing yet: nothing to move off the reference
        return
    if str(current.version) == str(reference.version):
        raise InputError(f"--mlflow-promote {alias}: names the reference's version now ({reference.name}/"
                         f"{reference.version}, given as {reference.uri}); a PROMOTE would move it to the candidate: "
                         "promote to another alias")


def check_fp32(source: Source) -> None:
    """A reference fetched from MLflow is FP32 (artifact.precision.check_reference), named by its URI and version."""
    from tiergate.artifact import load_artifact
    from tiergate.artifact.precision import check_reference

    check_reference(load_artifact(source.path), f"{source.uri} ({source.name}/{source.version})")


def local_artifact(value, role: str = "candidate", client=None) -> Path:
    """A file option of `inspect`, `explain` or `bisect` as a local file: a models:/ URI fetched (the gate's cache;
    a reference checked FP32), anything else the path as given."""
    if not is_model_uri(value):
        return Path(value)
    source = fetch(str(value), client)
    if role == "reference":
        check_fp32(source)
    return source.path


def lineage(sources: dict[str, Source]) -> dict | None:
    """The decision files' `lineage` field: per role fetched from MLflow, its identity (docs/json-shapes.md)."""
    return {role: {"mlflow": s.lineage()} for role, s in sources.items()} or None


def registry_tags(source: Source) -> dict[str, str]:
    """The MLflow identity as tiergate registry artifact tags."""
    return {f"mlflow.{k}": str(v) for k, v in source.lineage().items() if v not in (None, "")}


# --- after the gate ----------------------------------------------------------------------------------------


def tag_key(*parts: str) -> str:
    """A tag key MLflow accepts (letters, digits, '_', '-', '.', ' ', '/'), at most 250 characters."""
    return _TAG_KEY_BAD.sub("_", ".".join(parts))[:MAX_TAG_KEY]


def short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_TAG_VALUE else text[:MAX_TAG_VALUE - 3] + "..."


def verdict_tags(decision, decision_sha256: str, report: str | None) -> dict[str, str]:
    """The version tags of a decision: verdict, its JSON's sha256, each failing check, the report link."""
    tags = {TAG_PREFIX + "verdict": decision.verdict, TAG_PREFIX + "decision_sha256": decision_sha256}
    for check in decision.checks:
        if check.passed:
            continue
        place = "any" if check.device_class == "*" else check.device_class
        key = tag_key("tiergate", place, check.name, *([check.output] if check.output else []))
        tags[key] = short(("INCONCLUSIVE: " if check.inconclusive else "") + check.sentence())
    if report:
        tags[TAG_PREFIX + "report"] = short(report)
    return tags


def write_back(source: Source, decision, decision_sha256: str, *, report: str | None = None,
               promote: str | None = None, client=None) -> list[str]:
    """Tag the candidate's version (stale tiergate.* tags of an earlier gate removed) and, on PROMOTE, move
    `promote` to it. Returns what was done, as lines; raises the one-line error of a failure."""
    client = client or _client()
    where = f"{source.name}/{source.version}"
    tags = verdict_tags(decision, decision_sha256, report)
    done = []
    try:
        version = client.get_model_version(source.name, source.version)
        for key in sorted(set(version.tags or {}) - set(tags)):
            if key.startswith(TAG_PREFIX):
                client.delete_model_version_tag(source.name, source.version, key)
        for key, value in tags.items():
            client.set_model_version_tag(source.name, source.version, key, value)
        done.append(f"tagged {where}: {decision.verdict}, {len(tags) - 2 - bool(report)} failing check(s)")
        if promote and decision.verdict == "PROMOTE":
            client.set_registered_model_alias(source.name, promote, source.version)
            done.append(f"moved alias {promote} to {where}")
        elif promote:
            done.append(f"alias {promote} not moved ({decision.verdict})")
    except Exception as exc:  # noqa: BLE001 - one line
        raise problem(f"writing the verdict to MLflow {where}", exc) from None
    return done


# --- the watcher's state -----------------------------------------------------------------------------------


def new_versions(name: str, client=None) -> list[str]:
    """The versions of a registered model newer than the last one seen (ascending), not yet marked seen: call
    `mark_seen` after each is handled. The first look sees every version there is."""
    client = client or _client()
    tracking, registry = _uris(client)
    last = _last_seen(name, tracking, registry)
    try:
        found = client.search_model_versions(f"name = '{_quoted(name)}'")
    except Exception as exc:  # noqa: BLE001 - one line
        raise problem(f"listing the versions of {name}", exc) from None
    return [str(v) for v in sorted({int(m.version) for m in found}) if v > last]


def mark_seen(name: str, version: str, client=None) -> None:
    """Remember `version` as the last one seen of `name` (atomically; never moves back)."""
    from tiergate import state

    client = client or _client()
    tracking, registry = _uris(client)
    if int(version) <= _last_seen(name, tracking, registry):
        return
    state.write_json(_watch_path(name, tracking, registry),
                     {"name": name, "tracking_uri": masked(store_identity(tracking)),
                      "registry_uri": masked(store_identity(registry)),
                      "last_version": int(version), "at": state.now_iso()})


def _watch_path(name: str, tracking: str, registry: str) -> Path:
    from tiergate import state

    return state.mlflow_watch_path(cache_key({"store": store_identity(tracking), "registry": store_identity(registry),
                                              "name": name, "watch": True}))


def _last_seen(name: str, tracking: str, registry: str) -> int:
    try:
        return int(json.loads(_watch_path(name, tracking, registry).read_text())["last_version"])
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EnvironmentProblem(f"the MLflow watcher's state of {name} is unreadable: {exc}") from None


def _quoted(name: str) -> str:
    return name.replace("'", "\\'")
