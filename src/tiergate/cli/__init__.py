"""The `tiergate` command: a thin shell over the package."""
