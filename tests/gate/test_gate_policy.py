"""Policy files: defaults, per-tier and per-device-class overrides, and clear errors."""

from __future__ import annotations

from importlib import resources

import pytest
import tomllib

from tiergate.errors import InputError
from tiergate.policy import Thresholds, load_policy


@pytest.fixture
def write(tmp_path):
    def _write(text: str):
        path = tmp_path / "policy.toml"
        path.write_text(text)
        return path
    return _write


def test_defaults_come_from_the_packaged_file(device_classes):
    shipped = tomllib.loads(resources.files("tiergate").joinpath("data", "default-policy.toml").read_text())
    policy = load_policy()
    for key, value in shipped["defaults"].items():
        assert getattr(policy.defaults, key) == value
    assert policy.defaults.min_accuracy_ratio == 0.99           # MLPerf closed division
    assert (policy.defaults.min_cosine, policy.defaults.min_sqnr_db) == (0.997, 20.0)
    assert policy.defaults.max_latency_p99_ms is None and policy.defaults.max_cost_per_1k is None
    assert policy.for_target(device_classes["x86"]) == policy.defaults


def test_user_file_merges_over_defaults_and_overrides_apply(write, device_classes):
    policy = load_policy(write("""
[defaults]
min_cosine = 0.999
max_latency_p99_ms = 20
[override.x86-server]
max_latency_p99_ms = 5
min_sqnr_db = false
[override.x86]
max_latency_p99_ms = 4.5
[override.cortex-a]
max_cost_per_1k = 0.002
"""))
    x86, arm = policy.for_target(device_classes["x86"]), policy.for_target(device_classes["arm"])
    assert policy.defaults.min_cosine == 0.999 and policy.defaults.min_sqnr_db == 20.0   # untouched default kept
    assert x86.max_latency_p99_ms == 4.5                  # the device class wins over its tier
    assert x86.min_sqnr_db is None                        # switched off for the tier
    assert arm.max_latency_p99_ms == 20.0 and arm.max_cost_per_1k == 0.002 and arm.min_sqnr_db == 20.0
    assert isinstance(x86, Thresholds)
    policy.check_override_names(device_classes.values())


@pytest.mark.parametrize("text, message", [
    ("[defaults]\nmin_cosin = 0.9\n", "unknown key 'min_cosin' in [defaults]"),
    ("[override.cortex-a]\nmax_p99 = 3\n", "unknown key 'max_p99' in [override.cortex-a]"),
    ("[gate]\nmin_cosine = 0.9\n", "unknown key 'gate'"),
    ("min_cosine = 0.9\n", "unknown key 'min_cosine'"),
    ("[defaults]\nmin_cosine = 'high'\n", "min_cosine must be a number"),
    ("[defaults]\nmin_cosine = true\n", "min_cosine must be a number"),
    ("[defaults]\nconfidence = 1.5\n", "confidence must be between 0 and 1"),
    ("[defaults]\nconfidence = false\n", "confidence cannot be switched off"),
    ("[defaults]\np99_min_samples = 2.5\n", "p99_min_samples must be a whole number"),
    ("[defaults]\nmax_cost_per_1k = -1\n", "must not be negative"),
    ("[defaults\n", "not valid TOML"),
    ("override = 3\n", "'override' must be tables"),
])
def test_bad_policy_files_name_the_file_and_the_key(write, text, message):
    path = write(text)
    with pytest.raises(InputError) as err:
        load_policy(path)
    assert message in err.value.one_line() and str(path) in err.value.one_line()


def test_missing_policy_file(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_policy(tmp_path / "nope.toml")


def test_override_naming_no_tier_or_device_class_is_refused(write, device_classes):
    policy = load_policy(write("[override.cortex-m]\nmax_latency_p99_ms = 3\n"))
    with pytest.raises(InputError, match=r"\[override.cortex-m\] names no known tier or device class"):
        policy.check_override_names(device_classes.values())
