"""What `warmup` takes from its environment and when it refuses to warm.

torchrun's variables (WORLD_SIZE, RANK, LOCAL_RANK, and MASTER_ADDR/MASTER_PORT where ranks form a
process group) are checked before anything is imported or probed: a bad or missing one is one
`error:` line naming it, exit 2, never a traceback. A replay (--target/--snapshot) under torchrun
forms no process group, and without MASTER_ADDR/MASTER_PORT (nothing to compare snapshots through)
never imports torch. Without a GPU and without snapshots asked for,
warmup stores nothing, so it exits 1 instead of answering from the bundled snapshots.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusedattn_select import cli
from fusedattn_select.probing import bundled_snapshot, choice

ROOT = Path(__file__).resolve().parents[2]
GPT2 = str(ROOT / "configs" / "gpt2.yaml")
NO_DEVICE = "test: no GPU here"
TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Runs the CLI's main and says on stderr, after everything else, whether torch was imported.
PROGRAM = ("import sys\nfrom fusedattn_select import cli\ncode = cli.main(sys.argv[1:])\n"
           "sys.stderr.write('torch was imported\\n' if 'torch' in sys.modules else '')\nsys.exit(code)")
NO_ENGINE = ("error: warmup needs a CUDA device with cuDNN, or snapshots (--target, --snapshot or "
             f"FUSEDATTN_SELECT_SNAPSHOT): {NO_DEVICE}")


def program(tmp_path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    """The CLI in a fresh process with torchrun's variables as `env` gives them (and no others)."""
    base = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES and k != "FUSEDATTN_SELECT_SNAPSHOT"}
    return subprocess.run([sys.executable, "-c", PROGRAM, "warmup", *argv], capture_output=True, text=True, cwd=ROOT,
                          env={**base, "FUSEDATTN_SELECT_CACHE_DIR": str(tmp_path / "cache"), **env}, timeout=120)


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ----- torchrun's variables ---------------------------------------------------------------------
@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5", "2 ranks", "9" * 5000])
def test_a_world_size_that_is_not_a_positive_whole_number_is_one_error_line(tmp_path, value):
    result = program(tmp_path, {"WORLD_SIZE": value}, GPT2, "--target", "h100")
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr  # one line: no traceback, no torch
    assert result.stderr.startswith("error: WORLD_SIZE=")
    assert "must be a positive whole number, the number of ranks of the job" in result.stderr


def test_world_size_abc_names_the_value(tmp_path):
    result = program(tmp_path, {"WORLD_SIZE": "abc"}, GPT2, "--target", "h100")
    assert result.stderr == ("error: WORLD_SIZE='abc': must be a positive whole number, the number of ranks of the "
                             "job (torchrun sets it; unset for one process)\n")


def test_several_ranks_without_rank_is_an_error_naming_rank_even_for_a_replay(tmp_path):
    result = program(tmp_path, {"WORLD_SIZE": "2"}, GPT2, "--target", "h100")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == ("error: RANK=None: not set; must be a whole number from 0 to WORLD_SIZE-1 (1 here), "
                             "this process's rank among the WORLD_SIZE=2 ranks (torchrun sets it)\n")


@pytest.mark.parametrize("rank", ["2", "-1", "x", ""])
def test_a_rank_outside_the_job_is_an_error_naming_rank(tmp_path, rank):
    result = program(tmp_path, {"WORLD_SIZE": "2", "RANK": rank, "LOCAL_RANK": "0"}, GPT2, "--target", "h100")
    assert result.returncode == 2
    assert result.stderr == (f"error: RANK={rank!r}: must be a whole number from 0 to WORLD_SIZE-1 (1 here), "
                             "this process's rank among the WORLD_SIZE=2 ranks (torchrun sets it)\n")


@pytest.mark.parametrize("local_rank", [None, "x", "5"])
def test_a_missing_or_bad_local_rank_is_an_error_naming_local_rank(tmp_path, local_rank):
    env = {"WORLD_SIZE": "2", "RANK": "1", **({"LOCAL_RANK": local_rank} if local_rank is not None else {})}
    result = program(tmp_path, env, GPT2, "--target", "h100")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: LOCAL_RANK={local_rank!r}: ")
    assert "a whole number from 0 to WORLD_SIZE-1 (1 here), this process's rank on its node" in result.stderr


@pytest.mark.parametrize(("env", "named"), [
    ({}, "error: MASTER_ADDR=None: not set; must name the host of rank 0"),
    ({"MASTER_ADDR": "127.0.0.1"}, "error: MASTER_PORT=None: not set; must be a port number from 1 to 65535"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"}, "error: MASTER_PORT='99999': must be a port number"),
])
def test_a_shared_warmup_checks_the_rendezvous_before_importing_torch(tmp_path, env, named):
    result = program(tmp_path, {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", **env}, GPT2, "--depth", "fast")
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(named), result.stderr


def test_a_replay_under_torchrun_forms_no_process_group_and_rank_0_reports(tmp_path):
    ranks = [program(tmp_path, {"WORLD_SIZE": "2", "RANK": str(r), "LOCAL_RANK": str(r)}, GPT2, "--target", "h100")
             for r in (0, 1)]
    # No MASTER_ADDR/MASTER_PORT: had a rank tried to meet the other, it would have failed or waited.
    assert [r.returncode for r in ranks] == [0, 0], [r.stderr for r in ranks]
    assert "torch was imported" not in ranks[0].stderr + ranks[1].stderr
    assert "5 accepted, 0 rejected, 0 failed" in ranks[0].stdout
    assert "replayed from h100-configs.json" in ranks[0].stdout
    assert ranks[1].stdout == "" and ranks[1].stderr == ""  # one report per job: rank 0's


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "1", "RANK": "junk"}, {"WORLD_SIZE": ""}])
def test_one_process_reads_no_rank(tmp_path, env):
    result = program(tmp_path, env, GPT2, "--target", "h100", "--json")
    assert result.returncode == 0 and result.stderr == ""
    assert json.loads(result.stdout)["totals"]["accepted"] == 5


# ----- no device, no snapshots asked for ---------------------------------------------------------
@pytest.fixture
def no_device(monkeypatch):
    monkeypatch.setattr(choice, "live_engine", lambda: (None, NO_DEVICE))


@pytest.mark.parametrize("options", [(), ("--json",), ("--memory-ok", "--depth", "fast")])
def test_warmup_without_a_gpu_or_snapshots_stores_nothing_and_exits_1(capsys, no_device, options):
    code, out, err = run(capsys, "warmup", GPT2, *options)
    # The bundled snapshots could answer, but a warmup is asked to probe, build and store.
    assert (code, out) == (1, "")
    assert err == NO_ENGINE + "\n"


def test_warmup_without_a_gpu_replays_the_snapshots_its_environment_names(capsys, monkeypatch, no_device):
    monkeypatch.setenv("FUSEDATTN_SELECT_SNAPSHOT", str(bundled_snapshot("h100")))
    code, out, err = run(capsys, "warmup", GPT2, "--json")
    assert code == 0 and "error:" not in err
    assert json.loads(out)["engine"] == "snapshot:h100-configs.json"


def test_warmup_without_a_gpu_replays_a_target(capsys, no_device):
    code, out, err = run(capsys, "warmup", GPT2, "--target", "h100")
    assert code == 0 and "error:" not in err
    assert "nothing was probed, built or stored" in out


def test_a_rank_that_cannot_join_its_job_says_so_in_one_line_and_exits_1(monkeypatch, capsys, tmp_path):
    pytest.importorskip("torch")
    from fusedattn_select import distributed

    def never_met(*args, **kwargs):
        raise RuntimeError("the other ranks never met this one\n(and a second line torch adds)")

    monkeypatch.setattr(distributed, "init_from_torchrun", never_met)
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500", "FUSEDATTN_SELECT_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["warmup", GPT2]) == 1
    err = capsys.readouterr().err
    assert err == ("error: warmup: rank 1 of WORLD_SIZE=2 could not join the job's process group, so nothing was "
                   "warmed: RuntimeError: the other ranks never met this one\n"), err


@pytest.mark.parametrize("value", ["0", "-5", "inf", "soon"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_bad_input(capsys, value):
    code = cli.main(["warmup", GPT2, "--target", "h100", "--timeout", value])
    assert code == 2 and f"{value!r}: must be a positive number of seconds" in capsys.readouterr().err
