from datetime import timezone

import pytest

from tiergate.errors import InputError
from tiergate.registry.names import model_name, since, sha_prefix, tags


@pytest.mark.parametrize("name", ["digits", "mobilenet_v2", "a", "Res-Net.50", "x" * 128])
def test_model_name_accepts_plain_names(name):
    assert model_name(name) == name


@pytest.mark.parametrize("name", ["", "a/b", "..", "a..b", "../etc", "a\\b", "-lead", ".hidden", "sp ace",
                                  "x" * 129, "name\n", "ünï"])
def test_model_name_refuses_path_characters(name):
    with pytest.raises(InputError, match="model name"):
        model_name(name)


def test_tags_parse_pairs_and_refuse_bad_ones():
    assert tags(["team=vision", "ticket=EDGE-12", "note=a=b"]) == {"team": "vision", "ticket": "EDGE-12",
                                                                     "note": "a=b"}
    for bad in (["novalue"], ["=x"], ["a=1", "a=2"]):
        with pytest.raises(InputError):
            tags(bad)


def test_since_reads_dates_as_utc_and_refuses_garbage():
    when = since("2026-03-04")
    assert (when.year, when.month, when.day, when.tzinfo) == (2026, 3, 4, timezone.utc)
    assert since("2026-03-04T10:00+02:00").astimezone(timezone.utc).hour == 8
    with pytest.raises(InputError, match="--since"):
        since("last tuesday")


def test_sha_prefix_needs_hex():
    assert sha_prefix("ABCDEF12") == "abcdef12"
    with pytest.raises(InputError):
        sha_prefix("abc")
    with pytest.raises(InputError):
        sha_prefix("zzzzzzzz")
