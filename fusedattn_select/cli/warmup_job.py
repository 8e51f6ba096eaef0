"""`warmup` under torchrun: join the job, warm together, agree, leave; or, for a replay, check that
every rank replays the same snapshots.

A shared warmup reports what the ranks agreed (a problem they answered differently is NONE on every
rank) and every rank exits with that report's code: the process groups are destroyed and the
process ends without the interpreter's teardown, which gloo's threads can abort. A replay forms no
process group: through torchrun's store (torch.distributed.TCPStore, no process group) the ranks
compare a digest of their snapshot files and problems before any answer.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import sys
import time
from typing import Any, Mapping, NoReturn, Sequence

from fusedattn_select.config import AttnConfig
from fusedattn_select.selection.local_warmup import WarmupOutcome, WarmupReport
from fusedattn_select.errors import FusedAttnSelectError, first_line
from fusedattn_select.torchrun_env import Ranks, hosts_store, ranks_phrase, wait_for_address
from fusedattn_select.types import Backend

DISAGREED = "ranks disagree: every rank answers NONE (the warning above names the ranks and their answers)"
STORE_PREFIX = "fusedattn_select/warmup-replay"


def join_job(ranks: Ranks, timeout_s: float, quiet: bool = False) -> Any:
    """The distributed module, with this process joined to its torchrun job's process group; None
    after one error line (none when `quiet`: the rank said its own error) when it cannot join (no
    torch, or the other ranks did not meet it in time)."""
    try:
        from fusedattn_select import distributed  # needs torch: imported only to join a job
    except ImportError as err:
        if not quiet:
            _cannot_join(ranks, err)
        return None
    try:
        distributed.init_from_torchrun(timeout=timeout_s)  # a group of one rank (an existing one) warms locally
    except (distributed.DistributedError, RuntimeError, ValueError) as err:
        if not quiet:
            _cannot_join(ranks, err)
        return None
    return distributed


def refuse(distributed: Any, reason: str, timeout_s: float) -> None:
    """Say `reason` (why this rank does not warm; it printed it already) to the other ranks at the
    shared warmup's first exchange, so that each of them names this rank and its reason instead of a
    rank gone missing. That exchange then fails on every rank, by design: the others say so."""
    try:
        distributed.shared_warmup.refuse(reason, timeout=timeout_s)
    except FusedAttnSelectError:
        pass  # the DistributedError naming this refusal (and any other rank's) is the other ranks' to print


def _cannot_join(ranks: Ranks, err: BaseException) -> None:
    reason = f"{type(err).__name__}: {first_line(err)}" if str(err).strip() else type(err).__name__
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
    no_data = frozenset(row.cache_key for row in rows if row.outcome is WarmupOutcome.REJECTED
                        and (found := agreement.selection(row.name, row.cache_key)) is not None and found.no_data)
    return dataclasses.replace(shared.combined, rows=rows), no_data, agreement.to_dict()


def leave_job(group: Any, timeout_s: float) -> str:
    """Wait for every rank (at most `timeout_s`) and destroy the process groups; "" or why the wait failed."""
    try:
        group.leave(timeout_s)
        return ""
    except Exception as err:  # noqa: BLE001 - a DistributedError or gloo's own; the groups are gone either way
        return first_line(err)


def exit_now(code: int) -> NoReturn:
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


# ----- replay under torchrun -----------------------------------------------------------------------
def replay_digest(snapshot: Any, problems: Sequence[tuple[str, AttnConfig]], depth: Any) -> str:
    """sha256 of what a replay answers from and what it is asked: the snapshot engine's files, the
    problems' names and cache keys, the depth. Equal digests give equal answers."""
    digest = hashlib.sha256(snapshot.content_sha256().encode())
    digest.update(json.dumps([[name, cfg.cache_key()] for name, cfg in problems]).encode())
    digest.update(str(depth).encode())
    return digest.hexdigest()


def replay_mismatch(ranks: Ranks, environ: Mapping[str, str], mine: dict, timeout_s: float) -> tuple[str, bool]:
    """Whether every rank replays what this one does: ("", _) when they do (or cannot compare: no
    torchrun store or no torch), else (the error, whether every rank found it, so that rank 0 alone
    says it). `mine` is this rank's {"digest", "snapshots"}."""
    address, port = environ.get("MASTER_ADDR", "").strip(), environ.get("MASTER_PORT", "").strip()
    if not (address and port.isdigit()):
        return "", True  # not torchrun's job (it always sets them): nothing to meet through
    try:
        import torch.distributed as dist  # the store only: no process group is formed
    except ImportError:
        return "", True
    try:
        everyone = _statements(dist, ranks, environ, address, int(port), mine, timeout_s)
    except (RuntimeError, ValueError) as err:  # a rank missing past the timeout, or no store at the address
        reason = first_line(err)
        return (f"rank {ranks.rank} could not compare its snapshots with the other ranks' through torchrun's store "
                f"at {address}:{port} within {timeout_s:g} s: {reason}", False)
    groups: dict[str, list[int]] = {}
    for rank, statement in enumerate(everyone):
        groups.setdefault(statement["digest"], []).append(rank)
    if len(groups) == 1:
        return "", True
    return "ranks replay different snapshots or problems, so their answers could differ: " + "; ".join(
        f"{ranks_phrase(members)}: {everyone[members[0]]['snapshots']} (digest {digest[:12]})"
        for digest, members in groups.items()), True


def _statements(dist: Any, ranks: Ranks, environ: Mapping[str, str], address: str, port: int, mine: dict,
                timeout_s: float) -> list[dict]:
    """Every rank's `mine`, in rank order, exchanged through torchrun's store (or rank 0's)."""
    hosts = hosts_store(ranks.rank, environ)
    if not hosts:
        why = wait_for_address(address, port, timeout_s)
        if why:
            raise RuntimeError(why)
    store = dist.TCPStore(address, port, ranks.size, is_master=hosts, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s), multi_tenant=True)
    # The agent's store outlives a run: a job may run the command more than once, or restart.
    job = f"{STORE_PREFIX}/{environ.get('TORCHELASTIC_RUN_ID', '')}/{environ.get('TORCHELASTIC_RESTART_COUNT', '')}"
    run = f"{job}/{store.add(f'{job}/runs/{ranks.rank}', 1)}"
    store.set(f"{run}/{ranks.rank}", json.dumps(mine))
    keys = [f"{run}/{rank}" for rank in range(ranks.size)]
    store.wait(keys)
    everyone = [json.loads(store.get(key)) for key in keys]
    store.add(f"{run}/done", 1)
    if hosts:  # the store lives in this process: keep it until every rank has read
        deadline = time.monotonic() + timeout_s
        while store.add(f"{run}/done", 0) < ranks.size and time.monotonic() < deadline:
            time.sleep(0.05)
    return everyone

