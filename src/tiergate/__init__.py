"""tiergate: edge deployment revalidation.

The core (artifact, fingerprint, diff, lint, metrics, gate, registry, reports)
imports neither Prefect nor Docker; execution backends and flows do.
"""

__version__ = "0.1.0"
