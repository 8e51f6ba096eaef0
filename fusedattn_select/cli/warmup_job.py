"""`warmup` under torchrun: join the job, warm together, agree, leave.

A shared warmup reports what the ranks agreed (a problem they answered differently is NONE on every
rank) and every rank exits with that report's code: the process groups are destroyed and the
process ends without the interpreter's teardown, which gloo's threads can abort.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from fusedattn_select.selection.local_warmup import WarmupOutcome, WarmupReport
from fusedattn_select.torchrun_env import Ranks
from fusedattn_select.types import Backend

DISAGREED = "ranks disagree: every rank answers NONE (the warning above names the ranks and their answers)"


def join_job(ranks: Ranks, timeout_s: float) -> Any:
    """The distributed module, with this process joined to its torchrun job's process group; None
    after one error line when it cannot join (no torch, or the other ranks did not meet it in time)."""
    try:
        from fusedattn_select import distributed  # needs torch: imported only to join a job
    except ImportError as err:
        _cannot_join(ranks, err)
        return None
    try:
        distributed.init_from_torchrun(timeout=timeout_s)  # a group of one rank (an existing one) warms locally
    except (distributed.DistributedError, RuntimeError, ValueError) as err:
        _cannot_join(ranks, err)
        return None
    return distributed


def _cannot_join(ranks: Ranks, err: BaseException) -> None:
    text = str(err).strip()
    reason = f"{type(err).__name__}: {text.splitlines()[0][:300]}" if text else type(err).__name__
    print(f"error: warmup: rank {ranks.rank} of WORLD_SIZE={ranks.size} could not join the job's process "
          f"group, so nothing was warmed: {reason}", file=sys.stderr)


def agreed_report(shared: Any) -> tuple[WarmupReport, frozenset[str], dict]:
    """The job's report as the ranks agreed it, the cache keys of its no-data rows, and the agreement
    as JSON. A problem the ranks answered differently is NONE (rejected) in every rank's report, as
    agreement pinned it; the same on every rank, so every rank computes the same exit code."""
    agreement = shared.agreement
    disagreed = {d.cache_key for d in agreement.disagreements}
    rows = tuple(
        dataclasses.replace(row, backend=Backend.NONE, outcome=WarmupOutcome.REJECTED, reason=DISAGREED)
        if row.cache_key in disagreed else row
        for row in shared.combined.rows
    )
    no_data = frozenset(row.cache_key for row in rows
                        if row.outcome is WarmupOutcome.REJECTED and row.name in agreement.selections
                        and agreement.selections[row.name].no_data)
    return dataclasses.replace(shared.combined, rows=rows), no_data, agreement.to_dict()


def leave_job(group: Any, timeout_s: float) -> str:
    """Wait for every rank (at most `timeout_s`) and destroy the process groups; "" or why the wait failed."""
    try:
        group.leave(timeout_s)
        return ""
    except Exception as err:  # noqa: BLE001 - a DistributedError or gloo's own; the groups are gone either way
        return str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__


def exit_now(code: int) -> None:
    """End the process with `code` once stdout and stderr are flushed, skipping the interpreter's
    teardown: gloo's threads, even after destroy_process_group, can make it abort (SIGABRT,
    "terminate called without an active exception") and turn the computed code into 134."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass  # a closed reader: nothing more can be said on it
    os._exit(code)
