"""The Hopper probe suite's generator (run it as `python3 tools/gen_probe_suite.py`): `entries`
(names and key order of an entry, the base problem), `families` (what the suite covers, family by
family), `checks` (the suite's rules beyond AttnConfig's), `output` (the YAML text)."""
