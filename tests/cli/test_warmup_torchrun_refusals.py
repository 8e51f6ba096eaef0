"""`warmup` under torchrun where one rank refuses to warm and the others are ready: the refusing rank
says why on its own stderr and exits with its code; every other rank's one `error:` line names that
rank AND its reason (not only "rank 2 at leave", nor a join that timed out), promptly, and every rank
leaves the job cleanly. Each rank a fresh process with torchrun's variables meeting at a free local
port (env://), answering from recorded snapshots (FUSEDATTN_SELECT_SNAPSHOT: gloo, no GPU)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from tests.cli.test_cli_warmup_torchrun import GPT2, H100, finish, free_port, start_rank  # noqa: E402

WORLD, REFUSING, TIMEOUT_S = 3, 2, 30


def run_job(tmp_path: Path, argv_of, env_of) -> tuple[list[tuple[int, str, str]], float]:
    port = free_port()
    started = time.monotonic()
    results = finish([start_rank(tmp_path, rank, WORLD, port, [*argv_of(rank), "--timeout", str(TIMEOUT_S)],
                                 **env_of(rank)) for rank in range(WORLD)])
    return results, time.monotonic() - started


def assert_every_rank_names_the_refusal(results, refusing_code: int, reason: str) -> None:
    code, out, err = results[REFUSING]
    assert (code, out) == (refusing_code, ""), err
    assert err.splitlines() == [f"error: {reason}"], err  # its reason once; it left the job cleanly
    for rank, (code, out, err) in enumerate(results):
        if rank == REFUSING:
            continue
        assert (code, out) == (1, ""), err
        errors = [line for line in err.splitlines() if line.startswith(("error:", "warning:"))]
        assert len(errors) == 1 and errors[0].startswith("error: warmup: distributed warmup start: "), err
        assert f"failed on rank {REFUSING}: rank {REFUSING} (" in errors[0], err
        assert errors[0].endswith(reason), err  # why it refused, as it said it
        assert "Traceback" not in err


def test_a_rank_whose_config_file_is_missing_is_named_with_its_reason_by_every_rank(tmp_path):
    missing = str(tmp_path / "only-on-other-nodes.yaml")
    results, seconds = run_job(tmp_path, lambda rank: [missing if rank == REFUSING else GPT2],
                               lambda rank: {"FUSEDATTN_SELECT_SNAPSHOT": str(H100)})
    reason = results[REFUSING][2].removeprefix("error: ").strip()
    assert missing in reason, results[REFUSING][2]
    assert_every_rank_names_the_refusal(results, 2, reason)
    assert seconds < TIMEOUT_S  # told, not timed out


def test_a_rank_without_an_engine_is_named_with_its_reason_by_every_rank(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a rank without snapshots probes this machine's GPU: it does not refuse")
    results, seconds = run_job(tmp_path, lambda rank: [GPT2], lambda rank: (
        {} if rank == REFUSING else {"FUSEDATTN_SELECT_SNAPSHOT": str(H100)}))
    reason = results[REFUSING][2].removeprefix("error: ").strip()
    assert reason.startswith("warmup needs a CUDA device with cuDNN, or snapshots"), results[REFUSING][2]
    assert_every_rank_names_the_refusal(results, 1, reason)
    assert seconds < TIMEOUT_S


def test_a_rank_with_a_bad_setting_is_named_with_its_reason_by_every_rank(tmp_path):
    # Checked by every command before it starts; under torchrun the rank joins first and says it there.
    bad = {"FUSEDATTN_SELECT_DENSE_AFTER": "many"}
    results, seconds = run_job(tmp_path, lambda rank: [GPT2], lambda rank: {
        "FUSEDATTN_SELECT_SNAPSHOT": str(H100), **(bad if rank == REFUSING else {})})
    reason = results[REFUSING][2].removeprefix("error: ").strip()
    assert "FUSEDATTN_SELECT_DENSE_AFTER" in reason and "many" in reason, results[REFUSING][2]
    assert_every_rank_names_the_refusal(results, 2, reason)
    assert seconds < TIMEOUT_S


def test_a_rank_whose_engine_fails_to_start_with_another_error_is_named_by_every_rank(tmp_path):
    # Making the rank's selector raises an error of no library kind (as a CUDA initialisation can); the
    # rank's interpreter is made to fail there by a sitecustomize module on its path (a stand-in for the failure).
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import fusedattn_select.selection.selector as selector\n"
        "def _fails():\n"
        "    raise RuntimeError('CUDA error: initialization error')\n"
        "selector.selector_for = _fails\n")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    results, seconds = run_job(tmp_path, lambda rank: [GPT2], lambda rank: {
        "FUSEDATTN_SELECT_SNAPSHOT": str(H100), **({"PYTHONPATH": path} if rank == REFUSING else {})})
    reason = results[REFUSING][2].removeprefix("error: ").strip()
    assert reason == "RuntimeError: CUDA error: initialization error", results[REFUSING][2]
    assert_every_rank_names_the_refusal(results, 1, reason)
    assert seconds < TIMEOUT_S
