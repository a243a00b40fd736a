"""New MLflow model versions trigger the revalidation `tiergate register` triggers (flows/mlflow_watch.py polls).

`watch(name, reference, ...)` lists the versions of a registered MLflow model newer than the last one seen
(tiergate.mlflow_bridge.new_versions: that state under the home, written atomically) and, for each, oldest
first: fetches `models:/NAME/VERSION`, registers it in tiergate's registry with its FP32 reference (a file or
`models:/NAME@fp32`) and its MLflow identity as artifact tags (`mlflow.name`, `mlflow.version`, ...), and emits
the `tiergate.artifact.registered` event, exactly as `tiergate register` does: the `on-register` deployment then
revalidates it (flows/revalidate.py), one path per job, and tags the MLflow version with its verdict
(`tag_revalidated`). A version is marked seen only once its event was sent (else the next poll tries again).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Triggered:
    version: str
    sha256: str
    event: str
    seen: bool

    def to_json(self) -> dict:
        return dict(self.__dict__)


def watch(name: str, reference: str, *, registry_url: str | None = None, store: str | None = None,
          emit=None, client=None) -> list[Triggered]:
    """Trigger the revalidation of each new version of MLflow model `name` (see the module's doc)."""
    from tiergate import mlflow_bridge as mb
    from tiergate.orchestration.events import emit_registered
    from tiergate.registry import Registry, register_artifact
    from tiergate.registry.names import model_name

    emit = emit or emit_registered
    client = client or mb._client()
    model_name(name)
    done = []
    versions = mb.new_versions(name, client)
    if not versions:
        return done
    ref_path = mb.fetch(reference, client).path if mb.is_model_uri(reference) else Path(reference)
    with Registry(registry_url, store) as registry:
        for version in versions:
            source = mb.fetch(f"{mb.PREFIX}{name}/{version}", client)
            registered = register_artifact(registry, source.path, model=name, reference=ref_path,
                                           tags=mb.registry_tags(source))
            event = emit(registered.artifact, registered.reference)
            sent = event.startswith("sent")
            if sent:
                mb.mark_seen(name, version, client)
            done.append(Triggered(version, registered.artifact.sha256, event, sent))
            if not sent:        # the next poll tries this version (and the later ones) again
                break
    return done


def tag_revalidated(record, gate_run, report_files: dict) -> list[str]:
    """After a revalidation of an artifact that came from MLflow (its `mlflow.*` tags): tag that version with the
    verdict, the decision's sha256 and the failing checks, as `tiergate gate` does (no alias is moved)."""
    tags = record.tags or {}
    if "mlflow.name" not in tags or "mlflow.version" not in tags:
        return []
    import hashlib

    from tiergate import mlflow_bridge as mb
    from tiergate.reports.gate_files import decision_text

    written = report_files.get("json")
    text = Path(written).read_text(encoding="utf-8") if written else decision_text(gate_run.decision)
    source = mb.Source(tags.get("mlflow.uri", ""), tags["mlflow.name"], tags["mlflow.version"], None,
                       tags.get("mlflow.run_id"), tags.get("mlflow.source", ""), tags.get("mlflow.tracking_uri", ""),
                       tags.get("mlflow.registry_uri", ""), Path(record.filename))
    report = report_files.get("markdown")
    return mb.write_back(source, gate_run.decision, hashlib.sha256(text.encode()).hexdigest(),
                         report=str(Path(report).resolve()) if report else None)
