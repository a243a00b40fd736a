"""The registry: artifacts, runs, decisions, aliases and lineage in one SQL database.

SQLite by default (one file under TIERGATE_HOME, no server); any SQLAlchemy URL
(PostgreSQL for a team) through `--registry URL` or TIERGATE_REGISTRY_URL.
Every write is one transaction; a decision, its checks, its runs and the alias
moves it causes commit together or not at all.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

from sqlalchemy import create_engine, event, func, insert, select, update
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, IntegrityError, InterfaceError, NoSuchModuleError

from tiergate.errors import EnvironmentProblem, InputError
from tiergate.paths import home
from tiergate.registry import schema as s
from tiergate.registry.masking import masked, masked_text
from tiergate.registry.names import model_name, sha_prefix
from tiergate.registry.records import (
    VERDICTS,
    AliasMove,
    ArtifactRecord,
    Check,
    DecisionRecord,
    NewRun,
    RunRecord,
)
from tiergate.registry.store import Store

URL_ENV = "TIERGATE_REGISTRY_URL"


def default_url() -> str:
    return os.environ.get(URL_ENV) or f"sqlite:///{home() / 'registry.db'}"


def now() -> datetime:
    return datetime.now(timezone.utc)


def _engine(url: str) -> Engine:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InputError(f"registry URL {masked(url)!r} is not a SQLAlchemy URL (e.g. sqlite:///path/registry.db)"
                         ) from None
    where = masked(parsed.render_as_string(hide_password=False))
    if parsed.get_backend_name() != "sqlite":
        try:
            engine = create_engine(parsed, pool_pre_ping=True)
        except (NoSuchModuleError, ImportError) as exc:
            raise EnvironmentProblem(f"registry URL {where}: no driver for it ({masked_text(exc)})") from None
        event.listen(engine, "handle_error", _error_handler(f"registry {where}"))
        return engine
    if parsed.database and parsed.database != ":memory:":
        where = f"registry {parsed.database}"
        _check_sqlite_file(Path(parsed.database))
    else:
        where = "registry (in memory)"
    engine = create_engine(parsed, connect_args={"timeout": 30})
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    event.listen(engine, "handle_error", _error_handler(where))
    return engine


def _error_handler(where: str):
    """Database faults become one line naming the registry (never the SQL statement or its parameters).

    IntegrityError stays as it is: callers handle it (a concurrent registration of the same artifact).
    """
    def handle(context) -> None:
        exc = context.sqlalchemy_exception
        if isinstance(exc, IntegrityError) or not isinstance(exc, (DatabaseError, InterfaceError)):
            return
        orig = context.original_exception
        text = masked_text(" ".join(str(orig).split("\n")[0].split())) or type(orig).__name__
        raise EnvironmentProblem(f"{where}: {text}",
                                 hint="check that it is a tiergate registry, readable and writable, and reachable")
    return handle


def _check_sqlite_file(path: Path) -> None:
    """An existing registry file must hold a database; a new one is created whole (schema and all) and linked in.

    A 0-byte file is a truncated registry, never silently recreated empty. New files appear
    atomically (link of a finished temporary file), so a 0-byte file is never a registry being born.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = None
    except OSError as exc:
        raise EnvironmentProblem(f"registry {path}: cannot be read ({exc.strerror})") from None
    if size == 0:
        raise EnvironmentProblem(f"registry {path}: is empty (0 bytes), not a registry",
                                 hint="restore it from a backup, or remove it to start an empty registry")
    if size is not None:
        if path.is_dir():
            raise EnvironmentProblem(f"registry {path}: is a folder, not a registry file")
        return
    temp = path.with_name(f".{path.name}.new-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(f"sqlite:///{temp}")
        try:
            with engine.begin() as conn:
                s.metadata.create_all(conn)
                conn.execute(insert(s.meta).values(key="schema", value=str(s.SCHEMA_VERSION)))
        finally:
            engine.dispose()
        try:
            os.link(temp, path)
        except FileExistsError:
            pass                              # another process made it meanwhile: use theirs
    except OSError as exc:
        raise EnvironmentProblem(f"registry {path}: cannot be created ({exc.strerror or exc})") from None
    except DatabaseError as exc:
        raise EnvironmentProblem(f"registry {path}: cannot be created ({exc.orig})") from None
    finally:
        for leftover in (temp, temp.with_name(temp.name + "-journal")):
            leftover.unlink(missing_ok=True)


def _sqlite_connect(dbapi_conn, _record) -> None:
    dbapi_conn.isolation_level = None  # SQLAlchemy's "begin" hook below issues BEGIN itself
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    # Writers take the lock up front: two processes moving the same alias serialise
    # instead of failing on a read-to-write lock upgrade.
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("tiergate_write") else "BEGIN")


class _Connected:
    """The database and the store: connections for reading and for writing (a transaction), the schema made once."""

    def __init__(self, url: str | None = None, store: Store | str | Path | None = None):
        self.url = url or default_url()
        self.engine = _engine(self.url)
        self.store = store if isinstance(store, Store) else Store(store)
        self._create()

    def __repr__(self) -> str:
        return f"Registry({masked(self.url)!r}, {self.store!r})"

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Registry":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        with self._read() as conn:      # an existing registry is only read (it may be read-only)
            found = (conn.execute(select(s.meta.c.value).where(s.meta.c.key == "schema")).scalar()
                     if self.engine.dialect.has_table(conn, s.meta.name) else None)
        if found is None:
            with self._write() as conn:
                s.metadata.create_all(conn)
                found = conn.execute(select(s.meta.c.value).where(s.meta.c.key == "schema")).scalar()
                if found is None:
                    conn.execute(insert(s.meta).values(key="schema", value=str(s.SCHEMA_VERSION)))
                    found = s.SCHEMA_VERSION
        if found is not None and int(found) != s.SCHEMA_VERSION:
            raise EnvironmentProblem(f"registry {masked(self.url)} has schema {found}; this tiergate reads {s.SCHEMA_VERSION}")

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self.engine.connect().execution_options(tiergate_write=True) as conn, conn.begin():
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn



class _Artifacts(_Connected):
    """Artifacts: added with their lineage (parent, reference), found by hash or prefix, listed by model."""

    def add_artifact(self, path: Path, *, sha256: str, model: str, format: str, precision: str,
                     fingerprint: dict[str, Any], parent_sha: str | None = None,
                     reference_sha: str | None = None, config_sha: str | None = None,
                     tags: dict[str, str] | None = None, external_data: tuple[str, ...] = (),
                     at: datetime | None = None) -> ArtifactRecord:
        """Store the file and record it; the same sha under the same model returns the first record."""
        model_name(model)
        existing = self.find_artifact(sha256)
        if existing is not None:
            return self._again(existing, path, model=model, format=format, external_data=external_data,
                               parent_sha=parent_sha, reference_sha=reference_sha, config_sha=config_sha,
                               tags=tags)
        for label, sha in (("parent", parent_sha), ("reference", reference_sha)):
            if sha is not None and sha != sha256 and self.find_artifact(sha) is None:
                raise InputError(f"{label} artifact {sha[:12]} is not in the registry")
        # The file goes in first: a row never names a missing file. If the row cannot be written,
        # the stored file stays as a harmless orphan (content-addressed: a retry reuses it); it is
        # not deleted, as another process may be registering the same bytes at the same moment.
        key = self.store.put_artifact(path, sha256, format, external_data)
        row = dict(sha256=sha256, model=model, format=format, precision=precision, fingerprint=fingerprint,
                   parent_sha=parent_sha, reference_sha=reference_sha, config_sha=config_sha,
                   tags=dict(tags or {}), filename=path.name, size_bytes=path.stat().st_size,
                   store_key=key, registered_at=at or now())
        try:
            with self._write() as conn:
                conn.execute(insert(s.artifacts).values(**row))
        except IntegrityError:
            winner = self.find_artifact(sha256)  # registered by another process meanwhile
            if winner is None:
                raise
            return self._again(winner, path, model=model, format=format, external_data=external_data,
                               parent_sha=parent_sha, reference_sha=reference_sha, config_sha=config_sha,
                               tags=tags)
        return ArtifactRecord(**row)

    def _again(self, existing: ArtifactRecord, path: Path, *, model: str, format: str,
               external_data: tuple[str, ...], parent_sha: str | None, reference_sha: str | None,
               config_sha: str | None, tags: dict[str, str] | None) -> ArtifactRecord:
        """The same artifact registered again: tags merge, missing links are filled in, a changed link is refused."""
        short = existing.sha256[:12]
        if existing.model != model:
            raise InputError(f"{path}: artifact {short} is already registered as model {existing.model!r}")
        for label, old, new in (("reference", existing.reference_sha, reference_sha),
                                ("parent", existing.parent_sha, parent_sha),
                                ("configuration", existing.config_sha, config_sha)):
            if old and new and old != new:
                raise InputError(f"{path}: artifact {short} is registered with {label} {old[:12]}; it cannot "
                                 f"change to {new[:12]} (register the new pair under a new artifact)")
        if not self.store.exists(existing.store_key):     # the row is there but its file went: put it back
            self.store.put_artifact(path, existing.sha256, format, external_data)
        with self._write() as conn:
            row = conn.execute(select(s.artifacts).where(s.artifacts.c.sha256 == existing.sha256)
                               .with_for_update()).mappings().one()
            changes = {}
            merged = {**(row["tags"] or {}), **(tags or {})}
            if merged != (row["tags"] or {}):
                changes["tags"] = merged
            for column, new in (("reference_sha", reference_sha), ("parent_sha", parent_sha),
                                ("config_sha", config_sha)):
                if new and not row[column] and not (column == "reference_sha" and new == existing.sha256):
                    changes[column] = new
            if changes:
                conn.execute(update(s.artifacts).where(s.artifacts.c.sha256 == existing.sha256).values(**changes))
        return replace(_artifact(row), **changes)

    def find_artifact(self, sha256: str) -> ArtifactRecord | None:
        with self._read() as conn:
            row = conn.execute(select(s.artifacts).where(s.artifacts.c.sha256 == sha256)).mappings().first()
        return _artifact(row) if row else None

    def artifact(self, sha_or_prefix: str) -> ArtifactRecord:
        """One artifact by full sha256 or a unique hex prefix (6+ characters)."""
        prefix = sha_prefix(sha_or_prefix)
        with self._read() as conn:
            rows = conn.execute(select(s.artifacts).where(s.artifacts.c.sha256.startswith(prefix)).limit(2)).mappings().all()
        if not rows:
            raise InputError(f"no artifact {prefix} in the registry")
        if len(rows) > 1:
            raise InputError(f"artifact prefix {prefix} is ambiguous; give more characters")
        return _artifact(rows[0])

    def artifacts(self, model: str, since: datetime | None = None) -> list[ArtifactRecord]:
        """A model's artifacts, oldest first."""
        query = select(s.artifacts).where(s.artifacts.c.model == model)
        if since is not None:
            query = query.where(s.artifacts.c.registered_at >= since)
        with self._read() as conn:
            rows = conn.execute(query.order_by(s.artifacts.c.registered_at, s.artifacts.c.sha256)).mappings().all()
        return [_artifact(r) for r in rows]

    def models(self) -> list[str]:
        with self._read() as conn:
            return list(conn.execute(select(s.artifacts.c.model).distinct().order_by(s.artifacts.c.model)).scalars())

    def lineage(self, sha256: str) -> list[ArtifactRecord]:
        """The artifact, its parent, its parent's parent... (stops at a cycle or a missing parent)."""
        chain: list[ArtifactRecord] = []
        current = self.find_artifact(sha256)
        while current is not None and all(a.sha256 != current.sha256 for a in chain):
            chain.append(current)
            current = self.find_artifact(current.parent_sha) if current.parent_sha else None
        return chain

    def children(self, sha256: str) -> list[ArtifactRecord]:
        with self._read() as conn:
            rows = conn.execute(select(s.artifacts).where(s.artifacts.c.parent_sha == sha256)
                                .order_by(s.artifacts.c.registered_at)).mappings().all()
        return [_artifact(r) for r in rows]

    def fetch_artifact(self, sha256: str, dest: Path) -> Path:
        """Copy a stored artifact (with its external data) into dest; returns the model file."""
        record = self.artifact(sha256)
        return self.store.fetch(record.store_key, dest)



class _Runs(_Artifacts):
    """Runs of an artifact on a device class, their result folders in the store, the cache lookup by key."""

    def record_run(self, run: NewRun, artifact_sha: str, at: datetime | None = None) -> RunRecord:
        _check_runs([run])
        key = self.store.put_result(run.result_folder) if run.result_folder else None
        with self._write() as conn:
            return _insert_run(conn, run, artifact_sha, key, at or now())

    def runs(self, artifact_sha: str | None = None, device_class: str | None = None) -> list[RunRecord]:
        query = select(s.runs)
        if artifact_sha is not None:
            query = query.where(s.runs.c.artifact_sha == artifact_sha)
        if device_class is not None:
            query = query.where(s.runs.c.device_class == device_class)
        with self._read() as conn:
            return [_run(r) for r in conn.execute(query.order_by(s.runs.c.id)).mappings()]

    def find_cached_run(self, artifact_sha: str, device_class: str, image_id: str,
                        data_sha256: str) -> RunRecord | None:
        """The latest successful run of this exact input (artifact, device class, image, data), if any."""
        if not (artifact_sha and device_class and image_id and data_sha256):
            return None
        query = (select(s.runs).where(s.runs.c.artifact_sha == artifact_sha, s.runs.c.device_class == device_class,
                                      s.runs.c.image_id == image_id, s.runs.c.data_sha256 == data_sha256,
                                      s.runs.c.status == "ok")
                 .order_by(s.runs.c.id.desc()).limit(1))
        with self._read() as conn:
            row = conn.execute(query).mappings().first()
        return _run(row) if row else None

    def fetch_result(self, run: RunRecord, dest: Path) -> Path:
        """Copy a run's stored result folder (result.json, outputs.npz) into dest."""
        if not run.result_key:
            raise InputError(f"run {run.id} has no stored result folder")
        return self.store.fetch(run.result_key, dest)



class Registry(_Runs):
    """Records of artifacts, runs, decisions and aliases, plus the content-addressed store (the decisions, aliases
    and explanations here; artifacts and runs in the classes it builds on)."""

    def record_decision(self, artifact_sha: str, verdict: str, *, tiers: Iterable[str],
                        reasons: Iterable[str] = (), checks: Iterable[Check] = (),
                        cost_tags: dict[str, str] | None = None, detail: dict[str, Any] | None = None,
                        runs: Iterable[NewRun | int] = (), at: datetime | None = None,
                        reuse_same: bool = False) -> DecisionRecord:
        """Record a decision with its checks and runs; a promotion moves the model's alias for each tier.

        All of it is one transaction: an error (or a crash) anywhere leaves none of it recorded.
        With `reuse_same`, a decision identical (verdict and detail) to the artifact's latest one
        is not recorded again: that one comes back with `reused=True` (concurrent gates of one
        artifact record one decision and move each alias once). The check and the insert are one
        write transaction, serialised per artifact.
        """
        verdict = verdict.lower()
        if verdict not in VERDICTS:
            raise InputError(f"decision verdict {verdict!r} is not one of {', '.join(VERDICTS)}")
        artifact = self.artifact(artifact_sha)
        tiers, reasons, runs = sorted(set(tiers)), list(reasons), list(runs)
        _check_runs(runs)
        keys = [self.store.put_result(r.result_folder) if isinstance(r, NewRun) and r.result_folder else None
                for r in runs]
        when = at or now()
        detail = json.loads(json.dumps(dict(detail or {}), default=str))
        with self._write() as conn:
            if reuse_same:
                conn.execute(select(s.artifacts.c.sha256).where(s.artifacts.c.sha256 == artifact.sha256)
                             .with_for_update())   # PostgreSQL: one writer per artifact (SQLite: BEGIN IMMEDIATE)
                latest = conn.execute(select(s.decisions).where(s.decisions.c.artifact_sha == artifact.sha256)
                                      .order_by(s.decisions.c.id.desc()).limit(1)).mappings().first()
                if latest is not None and latest["verdict"] == verdict and latest["detail"] == detail:
                    return replace(_decision(conn, latest), reused=True)
            decision_id = conn.execute(insert(s.decisions).values(
                artifact_sha=artifact.sha256, model=artifact.model, verdict=verdict, tiers=tiers,
                reasons=reasons, cost_tags=dict(cost_tags or {}), detail=detail,
                decided_at=when)).inserted_primary_key[0]
            run_ids = [_insert_run(conn, r, artifact.sha256, key, when).id if isinstance(r, NewRun) else int(r)
                       for r, key in zip(runs, keys)]
            for run_id in run_ids:
                conn.execute(insert(s.decision_runs).values(decision_id=decision_id, run_id=run_id))
            recorded = tuple(_insert_check(conn, decision_id, c) for c in checks)
            if verdict == "promote":
                for tier in tiers:
                    _move_alias(conn, artifact.model, tier, artifact.sha256, decision_id, when)
        return DecisionRecord(id=decision_id, artifact_sha=artifact.sha256, model=artifact.model, verdict=verdict,
                              tiers=tiers, reasons=reasons, cost_tags=dict(cost_tags or {}),
                              detail=detail, decided_at=when, checks=recorded, run_ids=tuple(run_ids))

    def decisions(self, model: str | None = None, artifact_sha: str | None = None) -> list[DecisionRecord]:
        query = select(s.decisions)
        if model is not None:
            query = query.where(s.decisions.c.model == model)
        if artifact_sha is not None:
            query = query.where(s.decisions.c.artifact_sha == artifact_sha)
        with self._read() as conn:
            rows = conn.execute(query.order_by(s.decisions.c.id)).mappings().all()
            return [_decision(conn, r) for r in rows]

    def alias(self, model: str, tier: str) -> ArtifactRecord | None:
        """The artifact currently promoted for a model on a tier."""
        with self._read() as conn:
            sha = conn.execute(select(s.aliases.c.artifact_sha).where(
                s.aliases.c.model == model, s.aliases.c.tier == tier)).scalar()
        return self.find_artifact(sha) if sha else None

    def aliases(self, model: str) -> dict[str, str]:
        """tier -> promoted artifact sha256, for one model."""
        with self._read() as conn:
            rows = conn.execute(select(s.aliases.c.tier, s.aliases.c.artifact_sha)
                                .where(s.aliases.c.model == model).order_by(s.aliases.c.tier)).all()
        return {tier: sha for tier, sha in rows}

    def alias_history(self, model: str, tier: str | None = None) -> list[AliasMove]:
        """Every alias move of a model (optionally one tier), oldest first."""
        query = select(s.alias_history).where(s.alias_history.c.model == model)
        if tier is not None:
            query = query.where(s.alias_history.c.tier == tier)
        with self._read() as conn:
            rows = conn.execute(query.order_by(s.alias_history.c.id)).mappings().all()
        return [AliasMove(**{k: v for k, v in r.items() if k != "id"}) for r in rows]

    # explanations: a table added after schema 1, created on first write, read as empty where absent
    def record_explanation(self, decision_id: int, explanation: dict[str, Any],
                           at: datetime | None = None) -> int:
        """Record `tiergate explain`'s answer (Explanation.to_json()) for a recorded decision; returns its id.

        The same explanation as the decision's latest one is not recorded again (its id comes back).
        Non-finite numbers become null (the JSON column holds plain JSON on SQLite and PostgreSQL).
        """
        doc = _plain_json(dict(explanation))
        with self._write() as conn:
            if conn.execute(select(s.decisions.c.id).where(s.decisions.c.id == int(decision_id))).first() is None:
                raise InputError(f"no decision {decision_id} in the registry to attach an explanation to")
            s.explanations.create(conn, checkfirst=True)
            latest = conn.execute(select(s.explanations.c.id, s.explanations.c.explanation)
                                  .where(s.explanations.c.decision_id == int(decision_id))
                                  .order_by(s.explanations.c.id.desc()).limit(1)).first()
            if latest is not None and latest[1] == doc:
                return int(latest[0])
            return int(conn.execute(insert(s.explanations).values(
                decision_id=int(decision_id), explanation=doc, recorded_at=at or now())).inserted_primary_key[0])

    def explanations(self, decision_ids: Iterable[int] | None = None) -> dict[int, dict[str, Any]]:
        """decision id -> its latest recorded explanation ({} in a registry that never recorded one)."""
        query = select(s.explanations.c.decision_id, s.explanations.c.explanation).order_by(s.explanations.c.id)
        if decision_ids is not None:
            query = query.where(s.explanations.c.decision_id.in_([int(i) for i in decision_ids]))
        with self._read() as conn:
            if not self.engine.dialect.has_table(conn, s.explanations.name):
                return {}
            return {int(d): e for d, e in conn.execute(query).all()}


def _check_runs(runs: list) -> None:
    for run in runs:
        if isinstance(run, NewRun) and not (run.device_class and run.tier):
            raise InputError(f"run of device class {run.device_class!r} names no tier; "
                             "give NewRun(tier=...) from the device class")


def _insert_run(conn: Connection, run: NewRun, artifact_sha: str, key: str | None, when: datetime) -> RunRecord:
    row = dict(artifact_sha=artifact_sha, device_class=run.device_class, tier=run.tier, status=run.status,
               image_id=run.image_id, data_sha256=run.data_sha256, emulated=bool(run.emulated),
               machine=run.machine, versions=dict(run.versions), metrics=dict(run.metrics),
               result_key=key, created_at=when)
    run_id = conn.execute(insert(s.runs).values(**row)).inserted_primary_key[0]
    return RunRecord(id=run_id, **row)


def _insert_check(conn: Connection, decision_id: int, check: Check) -> Check:
    stored = replace(check, passed=bool(check.passed), value=_scalar(check.value),
                     threshold=_scalar(check.threshold), detail=check.detail or "")
    columns = s.checks.c.keys()          # a check's interval fields live in the decision's detail JSON
    conn.execute(insert(s.checks).values(decision_id=decision_id,
                                         **{k: v for k, v in asdict(stored).items() if k in columns}))
    return stored


def _scalar(value):
    """A JSON-safe check value: numbers (NaN/inf as strings), strings, booleans or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return float(value) if hasattr(value, "__float__") else str(value)


def _move_alias(conn: Connection, model: str, tier: str, sha: str, decision_id: int, when: datetime) -> None:
    where = (s.aliases.c.model == model, s.aliases.c.tier == tier)
    previous = conn.execute(select(s.aliases.c.artifact_sha).where(*where).with_for_update()).scalar()
    values = dict(artifact_sha=sha, decision_id=decision_id, moved_at=when)
    if previous is None:
        conn.execute(insert(s.aliases).values(model=model, tier=tier, **values))
    else:
        conn.execute(update(s.aliases).where(*where).values(**values))
    conn.execute(insert(s.alias_history).values(model=model, tier=tier, previous_sha=previous, **values))


def _artifact(row) -> ArtifactRecord:
    return ArtifactRecord(**dict(row))


def _run(row) -> RunRecord:
    return RunRecord(**dict(row))


def _decision(conn: Connection, row) -> DecisionRecord:
    check_rows = conn.execute(select(s.checks).where(s.checks.c.decision_id == row["id"])
                              .order_by(s.checks.c.id)).mappings().all()
    run_ids = conn.execute(select(s.decision_runs.c.run_id).where(s.decision_runs.c.decision_id == row["id"])
                           .order_by(s.decision_runs.c.run_id)).scalars().all()
    checks = tuple(Check(**{k: v for k, v in c.items() if k not in ("id", "decision_id")}) for c in check_rows)
    return DecisionRecord(**dict(row), checks=checks, run_ids=tuple(run_ids))


def count_rows(registry: Registry) -> dict[str, int]:
    """How many rows each table holds (for checks that nothing half-written stayed)."""
    tables = (s.artifacts, s.runs, s.decisions, s.checks, s.decision_runs, s.aliases, s.alias_history)
    with registry._read() as conn:
        return {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one() for t in tables}


def _plain_json(value):
    """value with every non-finite float as None (plain JSON for SQLite's and PostgreSQL's JSON columns)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_json(v) for v in value]
    return value
