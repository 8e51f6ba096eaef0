"""tools/results/ keeps the current result of each bench, one file per bench and device; the runs
before it stay in git (issue 35 item 6).

A file's bench is read from its name:
- the extension (`.json`, `.md`, `.txt`) is the format, not the bench: a run's JSON and the markdown
  table made from it are two files of one bench;
- the name is split at `-`; the one segment that names a GPU (`h100`, `h200`, `a100`, `gb200`,
  `mi300x`, ...) is the device: one bench may keep a file per device;
- a segment that is a git revision (7-40 hex digits, at least one of them a digit) or a run count
  (`run2`) names a run, not a bench, and is dropped;
- the segments left, joined by `-`, are the bench: `bench-h100-dispatch.json` is bench
  `bench-dispatch` (`python -m tools.bench --sections 5`) on the H100, `memcheck-h100-decode.txt`
  bench `memcheck-decode` (`tools.memcheck_bucket --decode`) on the H100.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tools" / "results"
FORMATS = (".json", ".md", ".txt")
DEVICE = re.compile(r"(?:[abhlv]|gb|mi)\d{2,3}[a-z]?")
RUN = re.compile(r"(?=[0-9a-f]*\d)[0-9a-f]{7,40}|run\d+")
# A path to a result as docs and code write it; `REV:tools/results/NAME` (git show) names history.
RESULT_PATH = re.compile(r"(?<![:\w])tools/results/([\w.-]+\.(?:json|md|txt))\b")


def bench_of(name: str) -> tuple[str, str]:
    """(bench, device) of a result file's name, by the rules in this module's docstring."""
    stem, suffix = name.rsplit(".", 1) if "." in name else (name, "")
    assert f".{suffix}" in FORMATS, f"{name}: a result is one of {', '.join(FORMATS)}"
    segments = stem.split("-")
    devices = [s for s in segments if DEVICE.fullmatch(s)]
    assert len(devices) == 1, f"{name}: names {len(devices)} devices {devices}; a result names exactly one"
    bench = [s for s in segments if not DEVICE.fullmatch(s) and not RUN.fullmatch(s)]
    return "-".join(bench), devices[0]


def duplicates(names: list[str]) -> dict[tuple[str, str], list[str]]:
    """Every (bench, device) that more than one of `names` holds, with those names."""
    files: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name in sorted(names):
        files[bench_of(name)].append(name)
    return {key: group for key, group in files.items() if len(group) > 1}


def result_names() -> list[str]:
    return sorted(p.name for p in RESULTS.iterdir() if p.is_file())


def test_results_hold_at_most_one_file_per_bench_and_device():
    assert duplicates(result_names()) == {}


def test_every_result_names_its_bench_and_one_device():
    for name in result_names():
        bench, device = bench_of(name)
        assert bench and device, name


def test_a_runs_json_and_its_markdown_are_two_files_of_one_bench():
    found = duplicates(["bench-h100-native.json", "bench-h100-native.md", "bench-h100-shapes.json"])
    assert found == {("bench-native", "h100"): ["bench-h100-native.json", "bench-h100-native.md"]}


def test_a_revision_or_run_count_in_a_name_is_another_run_of_the_same_bench():
    found = duplicates(["bench-h100-dispatch.json", "bench-h100-dispatch-0b25d76.json",
                        "bench-h100-shapes-728deef.md", "bench-h100-shapes-run2.md"])
    assert found == {
        ("bench-dispatch", "h100"): ["bench-h100-dispatch-0b25d76.json", "bench-h100-dispatch.json"],
        ("bench-shapes", "h100"): ["bench-h100-shapes-728deef.md", "bench-h100-shapes-run2.md"],
    }


def test_another_device_or_another_bench_is_not_a_second_file():
    names = ["bench-h100.md", "bench-h200.md", "bench-h200-selection-latency.md", "bench-h100-dispatch.json",
             "memcheck-h100-bucket.txt", "memcheck-h100-decode.txt", "fp8-amax-h100.json",
             "fp8-overlap-h100.json", "bench-distributed-h200.json"]
    assert duplicates(names) == {}
    assert bench_of("fp8-amax-h100.json") == ("fp8-amax", "h100")  # fp8 is no device
    assert bench_of("bench-distributed-h200.json") == ("bench-distributed", "h200")


def test_every_results_path_in_docs_and_code_is_in_the_tree():
    sources = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "tools").rglob("*.py"),
               *(ROOT / "fusedattn_select").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    named = {(str(path.relative_to(ROOT)), name)
             for path in sources for name in RESULT_PATH.findall(path.read_text(encoding="utf-8"))}
    assert ("docs/performance.md", "bench-h100-dispatch.json") in named  # the scan reads the links
    assert sorted(f"{where}: tools/results/{name}" for where, name in named if not (RESULTS / name).is_file()) == []


def test_a_git_show_of_a_removed_result_is_history_not_a_path():
    text = "`git show e14a93a:tools/results/bench-h100-dispatch.md`, [x](../tools/results/bench-h100-dispatch.json)"
    assert RESULT_PATH.findall(text) == ["bench-h100-dispatch.json"]
