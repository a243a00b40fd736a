"""Retry rules for the flows' tasks, and the Prefect task of the revalidation's diff.

A model that crashes, times out or runs out of memory is a failed run: it is
saved, gated and recorded, never retried. An engine that does not answer is an
infrastructure fault: the execution layer already retries it a few times within
one attempt, the orchestrator raises InfrastructureFault when a failed run's
engine is gone, and the task is retried after a pause (`retry_condition_fn`).
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tiergate.errors import InfrastructureFault

INFRA_RETRIES = 2
INFRA_RETRY_DELAY_S = float(os.environ.get("TIERGATE_INFRA_RETRY_DELAY_S", "5"))


def infrastructure_only(_task, _task_run, state) -> bool:
    """retry_condition_fn: retry a task only when it failed with an InfrastructureFault."""
    try:
        state.result()
    except InfrastructureFault:
        return True
    except BaseException:  # noqa: BLE001 - any other failure is final
        return False
    return False


@task(name="diff", task_run_name="diff against {previous_sha:.12}", cache_policy=NO_CACHE)
def diff_task(previous: Path, previous_sha: str, new: Path) -> dict:
    """Position-matched diff of the model's previous artifact and the new one (JSON shape of `tiergate diff`)."""
    from tiergate.artifact import load_artifact
    from tiergate.diff import diff_artifacts

    return diff_artifacts(load_artifact(previous), load_artifact(new)).to_json()
