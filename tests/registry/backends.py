"""Real registry and store backends for tests: a throw-away PostgreSQL server and a local S3 endpoint (moto).

- `postgres_server` (session): initdb + pg_ctl from the Debian `postgresql` package (scripts/setup
  installs it), as the `postgres` user when run as root, on 127.0.0.1 and a free port, with a
  temporary data directory; `new_database(server)` gives each test its own database.
- `s3_server` (session): moto's S3 server on 127.0.0.1 and a free port; AWS_ENDPOINT_URL and
  dummy credentials are set in os.environ, so subprocesses and s3fs find it; `new_bucket()`
  gives each test its own bucket.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@pytest.fixture(scope="session")
def postgres_server():
    """(host, port, user) of a PostgreSQL server that lives for the session."""
    bindir = postgres_bin()
    if bindir is None:
        pytest.fail("PostgreSQL is not installed (apt `postgresql`; scripts/setup installs it)", pytrace=False)
    # not under pytest's temp folder: that one is private to root (0700), and the server runs as `postgres`
    root = Path(tempfile.mkdtemp(prefix="tiergate-postgres-"))
    data = root / "data"
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
    port = free_port()
    subprocess.run(_as_postgres([str(bindir / "initdb"), "-D", str(data), "-U", "tiergate", "--auth=trust",
                                 "-E", "UTF8", "--no-sync"]), check=True, capture_output=True)
    log = root / "postgres.log"
    subprocess.run(_as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
                                 "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off "
                                       f"-c max_connections=200", "start"]), check=True, capture_output=True)
    try:
        yield ("127.0.0.1", port, "tiergate")
    finally:
        subprocess.run(_as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def new_database(server) -> str:
    """A fresh database on the server; returns its SQLAlchemy URL (psycopg 3)."""
    import psycopg

    host, port, user = server
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(host=host, port=port, user=user, dbname="postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://{user}@{host}:{port}/{name}"


@pytest.fixture(scope="session")
def s3_server():
    """The endpoint URL of a moto S3 server for the session (credentials and endpoint in os.environ)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1")
    try:
        yield endpoint
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def new_bucket() -> str:
    """A fresh bucket on the S3 endpoint; returns a store URL inside it."""
    import s3fs

    bucket = f"tiergate-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    return f"s3://{bucket}/store"


BACKENDS = [pytest.param(("sqlite", "folder"), id="sqlite-folder"),
            pytest.param(("postgresql", "s3"), id="postgresql-s3")]


def open_registry(request, kind: tuple[str, str], tmp_path: Path):
    """A Registry on the given (database, store) kinds, each fresh for the test."""
    from tiergate.registry import Registry

    database, store = kind
    url = (f"sqlite:///{tmp_path / 'reg' / 'registry.db'}" if database == "sqlite"
           else new_database(request.getfixturevalue("postgres_server")))
    location = str(tmp_path / "store") if store == "folder" else (request.getfixturevalue("s3_server"), new_bucket())[1]
    return Registry(url, location)


__all__ = ["BACKENDS", "new_bucket", "new_database", "open_registry", "postgres_server", "s3_server"]
