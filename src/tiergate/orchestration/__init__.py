"""Prefect wiring shared by the flows in flows/ and by `tiergate serve` (the core never imports this).

- `tasks`: the pipeline's steps as Prefect tasks; retries for infrastructure faults only.
- `gating`: intake → build → run → compare → gate → record → report, as a flow body.
- `remote`: a device class's runs on a Prefect work pool (a worker where the devices are).
- `deployments`: the deployments `tiergate serve` serves (event trigger, schedule).
See docs/prefect.md.
"""
