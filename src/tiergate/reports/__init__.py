"""Reports of a gate decision and of drift over time.

- `reports.junit.write_junit(decision, path)`: JUnit XML, one test case per check per device class.
- `reports.markdown.render_markdown(decision)`, `write_summary(decision, folder)`: CD job summary.
- `reports.gate_files.write_reports(gate_run, report_dir, junit)`: what `tiergate gate` writes.
- `reports.drift.cross_tier_matrix(labels, outputs)`: the drift report's cross-tier matrix from given outputs.
- `reports.html.write_report(report, folder)`: the drift report page + JSON.

The report's data is gathered from the registry outside the core (tiergate.registry.report_data);
this package only computes on and renders what it is given.

Import the submodule you need; this package imports nothing itself.
"""
