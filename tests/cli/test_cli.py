"""The fusedattn-select command line: why, info, snapshot record; output, JSON and exit codes.

Engines here are snapshots recorded with RecordingTestEngine (a test double, tests/conftest.py)
or no engine at all; device discovery and the bundled snapshot directory are replaced per test so
the answers do not depend on the machine the tests run on.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fusedattn_select import cli
from fusedattn_select.cli import engines
from fusedattn_select.probing import choice
from fusedattn_select.selection.selector import default_selector

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ["--set", "batch_size=2", "--set", "num_heads_q=16", "--set", "num_heads_kv=4",
           "--set", "seqlen_q=1024", "--set", "seqlen_kv=1024", "--set", "head_dim_qk=128"]
NO_DEVICE = "test: no GPU here"


def problem(**changes) -> list[str]:
    """PROBLEM's --set pairs with some values changed (each field is set once)."""
    return [f"{key}={changes.pop(key)}" if key in changes else arg
            for arg, key in ((arg, arg.partition("=")[0]) for arg in PROBLEM)]


@pytest.fixture
def bundled_dir(tmp_path, monkeypatch):
    """An empty directory standing in for the package's bundled snapshots."""
    directory = tmp_path / "bundled"
    directory.mkdir()
    monkeypatch.setattr(choice, "SNAPSHOT_DIR", directory)
    return directory


@pytest.fixture
def no_device(monkeypatch, bundled_dir):
    monkeypatch.setattr(choice, "live_engine", lambda: (None, NO_DEVICE))
    return bundled_dir


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ----- why -------------------------------------------------------------------------------------
def test_why_with_set_pairs_answers_one_problem(capsys, recorded_snapshot):
    code, out, err = run(capsys, "why", "--snapshot", str(recorded_snapshot), *PROBLEM, "--set", "is_training=false")
    assert code == 0, err
    assert "--set: batch_size=2 num_heads_q=16" in out
    assert "verdict" in out and "provenance" in out
    assert re.search(r"\n  F16 +forward +supported +check_support +snapshot +fast +2\.75\n", out)
    assert out.rstrip().endswith("-> F16")


def test_why_without_device_or_bundled_snapshot_answers_no_data_by_the_platform_rule(capsys, no_device):
    code, out, err = run(capsys, "why", *PROBLEM)
    assert code == 3
    first = out.splitlines()[0]
    assert first.startswith(f"no CUDA device/cuDNN here ({NO_DEVICE}); no bundled snapshot for h100 is installed")
    assert "so no problem can be answered (no data)" in first
    assert "rule:platform" in out
    assert "-> no data (only a live probe can answer): F16 forward and backward no data at rule:platform" in out


def test_why_without_device_answers_from_the_bundled_h100_snapshot(capsys, no_device, recorded_snapshot):
    shutil.copy(recorded_snapshot, no_device / "h100-configs.json")
    code, out, err = run(capsys, "why", *PROBLEM, "--set", "mask=causal")
    assert code == 0, err
    date = json.loads(recorded_snapshot.read_text())["recorded_at"][:10]
    assert out.splitlines()[0] == (
        f"no CUDA device/cuDNN here ({NO_DEVICE}); answering from the bundled snapshot recorded on "
        f"Test GPU H100, cuDNN 9.19.0 on {date}; choose with --target/--snapshot, or fusedattn_select.use_snapshots()"
    )
    assert "-> F16" in out


def test_why_target_merges_both_bundled_snapshots(capsys, bundled_dir, recorded_snapshot, tmp_path):
    shutil.copy(recorded_snapshot, bundled_dir / "h200-configs.json")
    data = json.loads(recorded_snapshot.read_text())
    data["entries"] = []
    (bundled_dir / "h200-hopper-suite.json").write_text(json.dumps(data))
    code, out, _ = run(capsys, "why", "--target", "h200", *PROBLEM, "--set", "mask=causal")
    assert code == 0
    assert "engine: snapshot:h200-configs.json+h200-hopper-suite.json" in out.splitlines()[0]


def test_why_target_without_bundled_snapshot_is_bad_input(capsys, bundled_dir):
    code, out, err = run(capsys, "why", "--target", "h200", *PROBLEM)
    assert code == 2 and out == ""
    assert err.startswith("error: no bundled snapshot for h200 is installed (h200-configs.json, h200-hopper-suite.json, h200-models.json missing")


def test_why_config_file_answers_every_entry_and_exits_1_when_any_is_none(capsys, recorded_snapshot, suite_file):
    code, out, _ = run(capsys, "why", str(suite_file), "--snapshot", str(recorded_snapshot))
    assert code == 1
    for name in ("train-causal", "infer", "head-dim-512", "pre-scale-bias", "out-of-memory", "fp8"):
        assert f"\n{name}: " in out
    assert "-> NONE: F16 forward not supported at check_support: head dim above 256" in out
    assert "-> no answer: the recorded probe failed (not a refusal; record it again on a GPU): F16 forward probe " \
        "failed at build_plans: " \
        "CUDA out of memory" in out
    assert "-> FP8" in out


def test_why_name_answers_one_entry(capsys, recorded_snapshot, suite_file):
    code, out, _ = run(capsys, "why", str(suite_file), "--name", "train-causal", "--snapshot", str(recorded_snapshot))
    assert code == 0
    assert "train-causal: " in out and "infer: " not in out


def test_why_json_prints_engine_fingerprint_and_selections(capsys, recorded_snapshot, suite_file):
    code, out, _ = run(capsys, "why", str(suite_file), "--json", "--snapshot", str(recorded_snapshot))
    assert code == 1
    document = json.loads(out)
    assert document["engine"] == "snapshot:test-gpu.json"
    assert document["fingerprint"]["device_name"] == "Test GPU H100"
    assert [r["name"] for r in document["results"]][:2] == ["train-causal", "infer"]
    selection = document["results"][0]["selection"]
    assert selection["backend"] == "F16" and selection["message"] == ""
    assert [v["phase"] for v in selection["verdicts"]] == ["forward", "backward"]
    assert {v["provenance"] for v in selection["verdicts"]} == {"snapshot"}
    wide = document["results"][2]["selection"]
    assert wide["backend"] == "NONE" and wide["reasons"] == [
        "F16 forward not supported at check_support: head dim above 256"]


def test_why_set_applies_on_top_of_every_entry(capsys, recorded_snapshot, suite_file):
    code, out, _ = run(capsys, "why", str(suite_file), "--json", "--set", "batch_size=3",
                       "--snapshot", str(recorded_snapshot))
    results = json.loads(out)["results"]
    assert {r["selection"]["config"]["batch_size"] for r in results} == {3}
    # batch size is part of the problem: nothing recorded for batch 3 (rules still answer theirs).
    probed = [r for r in results if r["name"] != "pre-scale-bias"]
    assert all("not recorded in test-gpu.json" in r["selection"]["message"] for r in probed)
    assert code == 1


def test_why_set_values_are_yaml(capsys, no_device):
    code, out, _ = run(capsys, "why", "--json", *PROBLEM, "--set", "mask=causal", "--set", "window_size=[128,0]",
                       "--set", "is_training=false", "--set", "attn_scale=1e-1", "--set", "head_dim_v=null")
    config = json.loads(out)["results"][0]["selection"]["config"]
    assert config["window_size"] == [128, 0] and config["is_training"] is False
    assert config["attn_scale"] == 0.1 and "head_dim_v" not in config


def test_why_full_probes_at_full_depth(capsys, monkeypatch, bundled_dir, recording_engine):
    monkeypatch.setattr(choice, "live_engine", lambda: (recording_engine, ""))
    code, out, _ = run(capsys, "why", "--json", "--full", *PROBLEM)
    document = json.loads(out)
    assert code == 0 and document["probe_depth"] == "full" and document["notice"] is None
    assert {v["depth"] for v in document["results"][0]["selection"]["verdicts"]} == {"full"}


def test_why_uses_the_snapshot_named_by_the_environment(capsys, monkeypatch, recorded_snapshot):
    monkeypatch.setenv("FUSEDATTN_SELECT_SNAPSHOT", str(recorded_snapshot))
    code, out, _ = run(capsys, "why", *PROBLEM)
    assert code == 0 and out.startswith("engine: snapshot:test-gpu.json")


def test_why_installs_its_selector_as_the_process_default(capsys, recorded_snapshot):
    run(capsys, "why", "--snapshot", str(recorded_snapshot), *PROBLEM)
    assert default_selector().engine_name == "snapshot:test-gpu.json"


def test_verbose_logs_probes_to_stderr(capsys, recorded_snapshot):
    code, _, err = run(capsys, "-v", "why", "--snapshot", str(recorded_snapshot), *PROBLEM)
    assert code == 0 and re.search(r"INFO fusedattn_select: replayed \w+ from snapshot:test-gpu.json in ", err)
    assert not logging.getLogger("fusedattn_select").handlers


# ----- bad input: exit 2, one line, no traceback -----------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["why", *problem(head_dim_qk=0)], "error: head_dim_qk=0: must be a positive integer"),
    (["why", *PROBLEM, "--set", "mask=sliding"], "error: mask='sliding': must be one of"),
    (["why", *PROBLEM, "--set", "head_dim=64"], "error: head_dim=64: unknown field"),
    (["why", *PROBLEM, "--set", "head_dim_qk"], "error: --set='head_dim_qk': must be key=value"),
    (["why", *PROBLEM, "--set", "window_size=[1,"], "error: window_size='[1,': is not a YAML value"),
    (["why", "--set", "batch_size=2"], "error: num_heads_q=None: required field is missing"),
    (["why"], "error: why: nothing to answer: give CONFIG.yaml files, --hf-config PATH_OR_JSON, or --set key=value pairs"),
    (["why", "--name", "x", *PROBLEM], "error: --name='x': selects an entry of a CONFIG file"),
    (["why", "missing.yaml"], "error: config file='missing.yaml': cannot be read"),
    (["why", "--snapshot", "missing.json", *PROBLEM], "error: snapshot missing.json: file not found"),
])
def test_bad_input_exits_2_with_one_error_line(capsys, no_device, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith(message)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert out == ""


def test_bad_field_in_a_config_file_entry_names_file_entry_and_field(capsys, no_device, suite_file):
    code, _, err = run(capsys, "why", str(suite_file), "--set", "num_heads_kv=5")
    assert code == 2
    assert err.strip() == f"error: {suite_file}: train-causal: num_heads_kv=5: must divide num_heads_q=16 (grouped-query attention)"


def test_unknown_name_exits_2_and_lists_the_entries(capsys, no_device, suite_file):
    code, _, err = run(capsys, "why", str(suite_file), "--name", "prefill")
    assert code == 2
    assert err.startswith("error: --name='prefill': no entry of the file has this name; must be one of 'train-causal', 'infer'")


@pytest.mark.parametrize("command", [["why", *PROBLEM], ["matrix", str(ROOT / "probes" / "hopper-suite-sample.yaml")],
                                     ["warmup", str(ROOT / "configs" / "gpt2.yaml")]])
@pytest.mark.parametrize("snapshots", [[""], [str(ROOT / "fusedattn_select" / "snapshots" / "h100-configs.json"), ""]])
def test_an_empty_snapshot_path_is_refused_naming_the_option(capsys, no_device, command, snapshots):
    # The library's own check named its argument (snapshots[0]) and Python's types (str or Path).
    code, out, err = run(capsys, *command, *[arg for path in snapshots for arg in ("--snapshot", path)])
    assert code == 2 and out == ""
    assert err.strip() == "error: --snapshot='': is an empty path, which names no file: give a snapshot file's path"


def test_corrupt_snapshot_exits_2_naming_the_file(capsys, tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{")
    code, _, err = run(capsys, "why", "--snapshot", str(path), *PROBLEM)
    assert code == 2 and f"snapshot {path}: not valid JSON" in err


def test_unknown_option_is_a_usage_error(capsys):
    code, _, err = run(capsys, "why", "--colour")
    assert code == 2 and "unrecognized arguments: --colour" in err


# ----- info ------------------------------------------------------------------------------------
def test_info_works_without_a_gpu(capsys, no_device, tmp_path):
    code, out, _ = run(capsys, "info")
    assert code == 0
    assert f"probing engine             none: {NO_DEVICE}" in out
    assert "GPU                        none (see above)" in out
    assert f"cache directory            {tmp_path / 'cache'}" in out
    assert "h100-configs.json: missing (not recorded yet)" in out


def test_info_json_reports_every_fact(capsys, no_device, recorded_snapshot):
    shutil.copy(recorded_snapshot, no_device / "h100-configs.json")
    code, out, _ = run(capsys, "info", "--json")
    facts = json.loads(out)
    assert code == 0
    for key in ("fusedattn_select", "python", "gpu", "compute_capability", "sm_count", "driver",
                "cudnn_backend", "cudnn_frontend", "torch", "cache_dir", "bundled_snapshots"):
        assert key in facts
    assert facts["gpu"] == f"none: {NO_DEVICE}"
    assert facts["bundled_snapshots"]["h100-configs.json"].startswith("Test GPU H100, cuDNN 9.19.0, recorded ")
    assert facts["bundled_snapshots"]["h200-configs.json"] == "missing (not recorded yet)"


def test_info_reports_the_live_device(capsys, monkeypatch, bundled_dir, recording_engine):
    monkeypatch.setattr(engines, "live_engine", lambda: (recording_engine, ""))
    facts = json.loads(run(capsys, "info", "--json")[1])
    assert (facts["gpu"], facts["compute_capability"], facts["sm_count"]) == ("Test GPU H100", "9.0", 132)
    assert (facts["cudnn_backend"], facts["cudnn_frontend"], facts["driver"]) == ("9.19.0", "1.32.0", "580.00")


# ----- snapshot record -------------------------------------------------------------------------
def test_snapshot_record_without_a_device_exits_2(capsys, no_device, suite_file, tmp_path):
    code, _, err = run(capsys, "snapshot", "record", str(suite_file), "-o", str(tmp_path / "s.json"))
    assert code == 2
    assert err.strip() == f"error: snapshot record needs a live CUDA device with cuDNN: {NO_DEVICE}"
    assert not (tmp_path / "s.json").exists()


def test_snapshot_record_checks_suites_before_touching_the_device(capsys, monkeypatch, tmp_path):
    def must_not_start():
        raise AssertionError("device touched")

    monkeypatch.setattr(engines, "live_engine", must_not_start)
    code, _, err = run(capsys, "snapshot", "record", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "s.json"))
    assert code == 2 and "cannot be read" in err


def test_snapshot_record_writes_a_snapshot_why_can_answer_from(capsys, monkeypatch, suite_file, tmp_path,
                                                                recording_engine):
    monkeypatch.setattr(engines, "live_engine", lambda: (recording_engine, ""))
    out_path = tmp_path / "rec.json"
    code, out, err = run(capsys, "snapshot", "record", str(suite_file), "-o", str(out_path), "--jobs", "2")
    assert code == 3  # written, but one probe failed: no answer for it, as why and matrix count it
    assert err == ("warning: 1 of the 7 entries' probes failed (out of memory, a CUDA error): the snapshot holds no "
                   "answer for them; record them again\n")
    assert out.startswith("recorded 7 entries (4 selected, 2 none, 1 failed) on Test GPU H100")
    assert out.rstrip().endswith(f"-> {out_path}")
    code, out, _ = run(capsys, "why", str(suite_file), "--name", "fp8", "--snapshot", str(out_path))
    assert code == 0 and "-> FP8" in out


def test_snapshot_record_rejects_zero_jobs(capsys, suite_file, tmp_path):
    code, _, err = run(capsys, "snapshot", "record", str(suite_file), "-o", str(tmp_path / "s.json"), "--jobs", "0")
    assert code == 2 and "must be a positive integer" in err


# ----- as a program ----------------------------------------------------------------------------
def _program(*argv):
    env = {k: v for k, v in os.environ.items() if k != "FUSEDATTN_SELECT_SNAPSHOT"}
    return subprocess.run([sys.executable, "-m", "fusedattn_select.cli", *argv], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


def test_module_runs_as_a_program_with_exit_codes(recorded_snapshot):
    ok = _program("why", "--snapshot", str(recorded_snapshot), *PROBLEM)
    assert ok.returncode == 0 and "-> F16" in ok.stdout
    none = _program("why", "--snapshot", str(recorded_snapshot), *problem(head_dim_qk=512),
                    "--set", "is_training=false")
    assert none.returncode == 1 and "-> NONE: " in none.stdout
    no_data = _program("why", "--snapshot", str(recorded_snapshot), *problem(head_dim_qk=512))
    assert no_data.returncode == 3 and "-> no data (only a live probe can answer): " in no_data.stdout
    bad = _program("why", "--snapshot", str(recorded_snapshot), *PROBLEM, "--set", "dropout=2")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: dropout=2.0: must be a float in [0, 1)"


def test_program_without_a_command_prints_usage_and_exits_2():
    result = _program()
    assert result.returncode == 2 and "usage: fusedattn-select" in result.stderr


def test_program_help_lists_the_commands():
    result = _program("--help")
    assert result.returncode == 0
    for command in ("why", "info", "snapshot", "warmup", "cache"):
        assert command in result.stdout


# ----- warmup and cache ------------------------------------------------------------------------
def _needs(module: str, name: str):
    imported = pytest.importorskip(module)
    if not hasattr(imported, name):
        pytest.skip(f"{module}.{name} is not in this checkout yet")


def test_warmup_answers_every_entry_with_the_process_selector(capsys, suite_file, recording_engine):
    _needs("fusedattn_select.selection.local_warmup", "warmup")
    from fusedattn_select.selection.selector import Selector, set_default_selector

    set_default_selector(Selector(recording_engine))
    code, out, _ = run(capsys, "warmup", str(suite_file), "--depth", "fast", "--jobs", "2", "--json")
    report = json.loads(out)
    assert code == 1  # head-dim-512, pre-scale-bias and out-of-memory have no backend
    assert [row["name"] for row in report["rows"]][:2] == ["test-suite/train-causal", "test-suite/infer"]
    # Every answer is cached (rule answers too). With a live engine, problems are answered by their
    # shape bucket's graphs: train-causal, infer (which also answers out-of-memory, seqlen 999 in
    # the same bucket) and train by three bucket forms; head-dim-512 by its rejected bucket form and
    # then its own graph; pre-scale-bias (a rule) and fp8 have no bucket form.
    assert default_selector().cache_info()["entries"] == 7


def test_warmup_draws_a_progress_bar_on_stderr_and_a_summary_table(capsys, suite_file, recording_engine):
    from fusedattn_select.selection.selector import Selector, set_default_selector

    set_default_selector(Selector(recording_engine))
    code, out, err = run(capsys, "warmup", str(suite_file), "--depth", "fast", "--jobs", "2")
    lines = err.strip().splitlines()
    assert lines and all(re.match(r"\[[#.]{30}\] \d+/\d+ ", line) for line in lines)
    total = int(lines[-1].split()[1].split("/")[1])
    assert lines[-1].startswith("[" + "#" * 30 + f"] {total}/{total}")
    assert re.search(r"\d+ accepted, \d+ rejected, \d+ failed", out)


def test_warmup_with_worker_processes_but_no_persistent_store_exits_2(capsys, suite_file, recording_engine):
    from fusedattn_select.selection.selector import Selector, set_default_selector

    set_default_selector(Selector(recording_engine))
    code, _, err = run(capsys, "warmup", str(suite_file), "--workers", "processes", "--jobs", "2")
    assert code == 2
    assert err.startswith("error: workers='processes': needs the live cuDNN engine") and "Traceback" not in err


def test_warmup_without_an_engine_exits_1(capsys, suite_file):
    _needs("fusedattn_select.selection.local_warmup", "warmup")
    from fusedattn_select.selection.selector import Selector, set_default_selector

    set_default_selector(Selector(None, unavailable_reason=NO_DEVICE))
    code, _, err = run(capsys, "warmup", str(suite_file))
    assert code == 1  # no device is not bad input: the warmup could not do what it was asked
    assert err.strip() == (f"error: warmup needs a CUDA device with cuDNN, or snapshots (--target, --snapshot or "
                           f"FUSEDATTN_SELECT_SNAPSHOT): {NO_DEVICE}")


def test_cache_info_export_import_clear(capsys, tmp_path):
    _needs("fusedattn_select.store", "PersistentStore")
    code, out, _ = run(capsys, "cache", "info", "--json")
    info = json.loads(out)
    assert code == 0 and info["path"].startswith(str(tmp_path / "cache"))
    export = tmp_path / "export.json"
    assert run(capsys, "cache", "export", str(export))[0] == 0 and export.is_file()
    code, out, _ = run(capsys, "cache", "import", str(export))
    assert code == 0 and json.loads(out)["skipped"] == []
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and out.startswith("cleared 0 decisions, 0 plans and 0 runner choices from ")


def test_cache_import_of_a_missing_file_is_bad_input(capsys, tmp_path):
    _needs("fusedattn_select.store", "PersistentStore")
    code, _, err = run(capsys, "cache", "import", str(tmp_path / "missing.json"))
    assert code == 2 and err.startswith("error: ") and "missing.json" in err
