"""Reports of a gate decision and of drift over time.

- `reports.junit.write_junit(decision, path)`: JUnit XML, one test case per check per device class.
- `reports.markdown.render_markdown(decision)`, `write_summary(decision, folder)`: CD job summary.
- `reports.drift`: the drift report's data from the registry.

Import the submodule you need; this package imports nothing itself.
"""
