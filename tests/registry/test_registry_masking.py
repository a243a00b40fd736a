"""Secrets never reach a message: the registry's and the store's locations are masked by one function
(tiergate.registry.masking), the password of user:password@ and every secret-looking query parameter alike; an
unreachable registry or S3 endpoint is one line and exit 2, naming the place without its secrets."""

from __future__ import annotations

import numpy as np
import pytest

import modelkit
from backends import free_port
from tiergate.cli.main import main
from tiergate.registry.masking import masked, masked_text

SECRETS = ("pw-userinfo", "pw-query", "tok-query", "ssl-pw", "ak-secret", "sk-secret", "sig-secret")


@pytest.mark.parametrize("url, shown", [
    ("postgresql+psycopg://u:pw-userinfo@db:5432/reg?password=pw-query&application_name=ci",
     "postgresql+psycopg://u:***@db:5432/reg?password=***&application_name=ci"),
    ("postgresql://u@db/reg?sslmode=require&sslpassword=ssl-pw", "postgresql://u@db/reg?sslmode=require&sslpassword=***"),
    ("s3://bucket/tg?access_key=ak-secret&Secret_Key=sk-secret&region=eu",
     "s3://bucket/tg?access_key=***&Secret_Key=***&region=eu"),
    ("https://h/x?X-Amz-Signature=sig-secret&token=tok-query", "https://h/x?X-Amz-Signature=***&token=***"),
    ("postgresql://u:p/w@d@db/reg", "postgresql://u:***@db/reg"),
    ("sqlite:////tmp/registry.db", "sqlite:////tmp/registry.db"),
    ("not a url?passwd=pw-query", "not a url?passwd=***"),
])
def test_every_secret_looking_part_is_masked(url, shown):
    assert masked(url) == shown


def test_messages_are_masked_too():
    text = ('connection to "postgresql://u:pw-userinfo@h/d?pwd=pw-query": failed; password=ssl-pw host=h, '
            'endpoint "http://127.0.0.1:9/b/x%3Ftoken%3Dtok-query/k"')
    out = masked_text(text)
    assert not any(s in out for s in SECRETS) and "host=h" in out and "http://127.0.0.1:9/b/x" in out


def _one_line(capsys, code) -> str:
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in out + err and "internal error" not in err, err
    assert not any(s in out + err for s in SECRETS), err
    return lines[0]


@pytest.fixture
def model(tmp_path):
    return modelkit.write(modelkit.linear(np.eye(4)), tmp_path / "m.onnx")


def test_an_unreachable_postgresql_registry_masks_its_query_password(model, tiergate_home, capsys):
    port = free_port()                              # nothing listens there
    url = f"postgresql+psycopg://u:pw-userinfo@127.0.0.1:{port}/reg?password=pw-query&sslpassword=ssl-pw"
    line = _one_line(capsys, main(["register", str(model), "--model", "m", "--reference", str(model),
                                   "--registry", url]))
    assert f"127.0.0.1:{port}" in line and "password=***" in line


@pytest.fixture
def fresh_s3fs():
    """s3fs caches its filesystems by their arguments, not the environment: a test's endpoint must not reuse
    (nor leave behind) an instance made for another one (the session's moto server)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def test_an_unreachable_s3_store_is_one_line_naming_the_endpoint(model, tiergate_home, capsys, monkeypatch,
                                                                  fresh_s3fs):
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ak-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sk-secret")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")
    line = _one_line(capsys, main(["register", str(model), "--model", "m", "--reference", str(model),
                                   "--store", "s3://bucket/tg?token=tok-query"]))
    assert line.startswith("tiergate: error: store s3://bucket/tg?token=***") and f"127.0.0.1:{port}" in line
