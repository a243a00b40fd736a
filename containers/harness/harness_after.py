"""After an artifact's result is written (tiergate_harness.py): its runtime graph described (--describe N,
tiergate_describe.py) and its calls interleaved with --pair-model's (harness_paired.py), each in its own files or
result.json's extra.paired, so no figure of the run changes; a step that fails says why and the run stays a result.
"""

from __future__ import annotations

import json
import os
import sys

from harness_data import slices
from harness_output import write_json
from harness_runners import make_runner


def describe_after(args, wanted):
    """The artifact's runtime graph at the level it ran beside its finished result (the describer's own files),
    when asked: the run's figures are written first, so the describe's session changes none of them. A describe that fails
    leaves no describe.json: the host then describes the artifact in a container of its own."""
    if not wanted:
        return
    try:
        import tiergate_describe

        tiergate_describe.describe(args.runtime, args.model, args.out, args.threads, own_level=True,
                                   disabled=getattr(args, "disabled_passes", []))
    except Exception as exc:  # noqa: BLE001 - the run is done and stays a result; the host describes it apart
        print(f"harness: describing {args.model} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        try:
            os.remove(os.path.join(args.out, "describe.json"))
        except OSError:
            pass


def pair_after(args, loaded, wanted):
    """The artifact's calls interleaved with --pair-model's (harness_paired.py), after its result is written (so
    no figure of the run changes), added to its result.json as extra.paired; a pairing that fails or does not
    end says why there (extra.paired.error) and the run stays a result."""
    if not wanted:
        return
    path = os.path.join(args.out, "result.json")
    with open(path) as fh:
        device = json.load(fh).get("device") or {}
    own = (device.get("load_ms", 0) + device.get("first_inference_ms", 0)) / 1000

    def failed(text):
        print(f"harness: pairing {args.model} with {args.pair_model} failed: {text}", file=sys.stderr)
        _add_paired(path, {"error": " ".join(str(text).split())[:300]})

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()          # a partner that crashes takes the pairing's process down, not the artifact's run
    if pid == 0:
        try:
            import harness_paired

            _add_paired(path, harness_paired.measure(args, loaded, make_runner, slices, own, failed))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the run is done; the host falls back to its loops
            failed(exc.code if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code != 0:
        failed(f"the pairing's process was killed by signal {-code}" if code < 0 else f"exited with code {code}")


def _add_paired(path, paired):
    with open(path) as fh:
        result = json.load(fh)
    result["extra"]["paired"] = paired
    write_json(path, result)
