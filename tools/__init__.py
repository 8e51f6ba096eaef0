"""Developer tools of this repository: the benchmark (`python -m tools.bench`) and the probe-suite
generator (`python3 tools/gen_probe_suite.py`). Not part of the installed package."""
