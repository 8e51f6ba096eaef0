"""The ranks a call communicates with, and the one way it communicates: an exchange that never hangs.

Every collective of this package is one `Communicator.exchange`: each rank runs its local step,
catching any exception, and contributes either its result or an error marker to one
`all_gather_object`. When any rank failed, every rank raises the same DistributedError naming the
failed ranks and their errors, so no rank is left waiting in a later collective. Each contribution
names its step: ranks that meet at different steps (a rank that stopped early and is leaving, ranks
calling different functions) raise a DistributedError naming each rank's step, never read one
step's values as another's. A rank that does
not arrive within `timeout` (it crashed, hangs, or was not asked to take part) makes the others
raise a DistributedError instead of hanging: exchanges run over a gloo group this package makes with
that timeout (objects, not GPU tensors; gloo's monitored_barrier names the ranks that did not arrive,
and a rank waiting on the lowest rank waits as long as its group's timeout, so never the caller's group).

Without an initialised process group, or with a group of one rank, nothing is communicated and a
local error propagates as it is.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import torch.distributed as dist

from fusedattn_select.errors import ConfigError, FusedAttnSelectError, first_line
from fusedattn_select.forking import renew_locks_after_fork
from fusedattn_select.torchrun_env import (
    DEFAULT_TIMEOUT_S,
    Ranks,
    hosts_store,
    ranks_phrase,
    torchrun_ranks,
    wait_for_address,
)

log = logging.getLogger("fusedattn_select")

T = TypeVar("T")


@dataclass(frozen=True)
class RankFailure:
    """What went wrong on one rank: its global rank, host and "ExceptionType: message"."""

    rank: int
    host: str
    error: str

    def describe(self) -> str:
        return f"rank {self.rank} ({self.host}): {self.error}"


class DistributedError(FusedAttnSelectError):
    """A collective step of fusedattn_select.distributed failed on some rank or timed out.

    Raised on every rank of the group alike; `step` names the exchange, `failures` the ranks that
    raised (empty for a timeout or a lost rank).
    """

    def __init__(self, step: str, message: str, failures: tuple[RankFailure, ...] = ()) -> None:
        self.step = step
        self.failures = failures
        super().__init__(f"distributed {step}: {message}")


class Refusal(FusedAttnSelectError):
    """Why a rank does not take part, raised in place of its part of an exchange (shared_warmup.refuse):
    every rank's DistributedError gives its text as the rank said it, without an exception type."""


@dataclass(frozen=True)
class _Contribution:
    """One rank's part of an exchange at `step`: its value, or what it raised."""

    rank: int
    step: str
    value: Any = None
    failure: RankFailure | None = None


def _timedelta(timeout: float | datetime.timedelta) -> datetime.timedelta:
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError("timeout", timeout, "must be a positive number of seconds or a datetime.timedelta")
    return datetime.timedelta(seconds=seconds)


class _GlooGroups:
    """The gloo groups this package made, by (ranks, timeout), in the job's process group of the time."""

    def __init__(self) -> None:
        self._groups: dict[tuple[tuple[int, ...], float], Any] = {}
        self._world: Any = None  # the job's process group the groups were made in
        self._renew_locks()
        renew_locks_after_fork(self)

    def _renew_locks(self) -> None:
        self._lock = threading.Lock()  # fresh in a forked child: no thread of the parent releases it there

    def get(self, ranks: tuple[int, ...], timeout: datetime.timedelta) -> Any:
        """A gloo group of `ranks` whose timeout is `timeout` (made once per ranks and timeout).

        Never the caller's group, even a gloo one: monitored_barrier makes every rank but the lowest wait
        for the lowest as long as the group's own timeout, whatever timeout it is given. Only members
        create it (use_local_synchronization), so a subgroup's call does not need the ranks outside it;
        creation waits at most `timeout` for the members. Groups made in a process group the job has
        since destroyed (and made anew) are destroyed with it: they are made again in the new one.
        """
        key = (ranks, timeout.total_seconds())
        with self._lock:
            if self._world is not dist.group.WORLD:
                self._groups.clear()
                self._world = dist.group.WORLD
            if key not in self._groups:
                started = time.monotonic()
                try:
                    self._groups[key] = dist.new_group(list(ranks), timeout=timeout, backend="gloo",
                                                       use_local_synchronization=True)
                except RuntimeError as err:
                    raise DistributedError(
                        "setup", f"rank {dist.get_rank()} gave up after waiting {time.monotonic() - started:.1f} s "
                        f"(timeout {timeout.total_seconds():g} s) for {ranks_phrase(ranks)} to form a gloo group "
                        f"(one crashed, hangs, or was not asked to take part): {first_line(err)}") from err
            return self._groups[key]

    def forget(self) -> None:
        """The job's process group is being destroyed: its groups with it."""
        with self._lock:
            self._groups.clear()
            self._world = None


_gloo_groups = _GlooGroups()


class Communicator:
    """The ranks of `group` (default: the whole job) and the exchanges between them.

    `rank` and `ranks` are global ranks (what torchrun calls RANK). With no initialised process
    group the communicator is one rank, 0, and exchanges nothing.
    """

    def __init__(self, group: Any = None, timeout: float | datetime.timedelta = DEFAULT_TIMEOUT_S) -> None:
        self.timeout = _timedelta(timeout)
        self.host = socket.gethostname()
        self._group = None
        if not (dist.is_available() and dist.is_initialized()):
            self.rank, self.ranks = 0, (0,)
            return
        group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank()
        self.ranks = tuple(dist.get_process_group_ranks(group))
        if self.rank not in self.ranks:
            raise DistributedError("setup", f"rank {self.rank} is not a member of the group (ranks {list(self.ranks)})")
        if len(self.ranks) > 1:
            self._group = _gloo_groups.get(self.ranks, self.timeout)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def lowest(self) -> bool:
        """Whether this is the group's lowest rank (the one that logs what every rank found)."""
        return self.rank == min(self.ranks)

    def exchange(self, step: str, produce: Callable[[], T]) -> list[T]:
        """Every rank's `produce()` result, in the order of `ranks`; raises on every rank if one failed."""
        failure: BaseException | None = None
        try:
            mine = _Contribution(self.rank, step, value=produce())
        except Exception as err:  # noqa: BLE001 - reported to every rank below, then raised
            failure = err
            reason = str(err) if isinstance(err, Refusal) else f"{type(err).__name__}: {err}"
            mine = _Contribution(self.rank, step, failure=RankFailure(self.rank, self.host, reason))
        if self._group is None:
            if failure is not None:
                raise failure
            return [mine.value]
        gathered = self._gather(step, mine)
        failures = tuple(c.failure for c in gathered if c.failure is not None)
        text = "; ".join(f.describe() for f in failures)
        if len({c.step for c in gathered}) > 1:
            raise DistributedError(step, _steps_differ(gathered) + (f"; failed on {text}" if text else ""),
                                   failures) from failure
        if failures:
            raise DistributedError(step, f"failed on {ranks_phrase([f.rank for f in failures])}: {text}",
                                   failures) from failure
        return [c.value for c in gathered]

    def _gather(self, step: str, mine: _Contribution) -> list[_Contribution]:
        started = time.monotonic()
        try:
            self._barrier()  # names the ranks that did not arrive, before the gather that would just wait
            gathered: list[Any] = [None] * self.size
            dist.all_gather_object(gathered, mine, group=self._group)
        except RuntimeError as err:
            raise self._gave_up(step, started, err) from err
        return gathered

    def _barrier(self) -> None:
        dist.monitored_barrier(group=self._group, timeout=self.timeout, wait_all_ranks=True)

    def _gave_up(self, step: str, started: float, err: BaseException) -> DistributedError:
        return DistributedError(
            step, f"rank {self.rank} gave up after waiting {time.monotonic() - started:.1f} s (timeout "
            f"{self.timeout.total_seconds():g} s) for the other ranks (one crashed, hangs, or was not asked to "
            f"take part; raise timeout= if a rank is only slow): {first_line(err)}",
        )


def refuse(step: str, reason: str, group: Any = None, timeout: float | datetime.timedelta = DEFAULT_TIMEOUT_S) -> None:
    """Take part in the exchange `step` with `reason` (why this rank will not take part) in place of its
    part, so that every other rank raises a DistributedError naming this rank and `reason`, not only
    that it went missing. Raises that DistributedError here too (naming every rank that refused, and
    why); without other ranks, Refusal(reason)."""

    def refusal() -> None:
        raise Refusal(reason)

    Communicator(group, timeout).exchange(step, refusal)


def tell_others(step: str, err: BaseException, group: Any, timeout: Any) -> None:
    """Before this rank raises `err` (a bad argument or setting found before a call's first exchange
    `step`): say it to the other ranks of `group` at that exchange, so that each of them raises a
    DistributedError naming this rank and `err` at once, instead of waiting for it until its timeout.
    Nothing without an initialised process group. What the exchange raises is only logged (debug):
    `err` is what this rank raises."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        refuse(step, f"{type(err).__name__}: {err}", group, timeout)
    except Exception as failed:  # noqa: BLE001 - a bad group or timeout, the others' errors: not this rank's to raise
        log.debug("fusedattn_select: distributed %s: told the other ranks this rank's error: %s", step,
                  first_line(failed))


def _steps_differ(gathered: list[_Contribution]) -> str:
    """What every rank says when the ranks of one exchange were at different steps."""
    at: dict[str, list[int]] = {}
    for c in gathered:
        at.setdefault(c.step, []).append(c.rank)
    return ("ranks reached different steps (a rank stopped early after an error of its own, or the ranks "
            "called different functions): " + "; ".join(f"{ranks_phrase(r)} at {s}" for s, r in at.items()))


def init_from_torchrun(timeout: float | datetime.timedelta = DEFAULT_TIMEOUT_S) -> bool:
    """Under torchrun (WORLD_SIZE > 1): join the job's process group (gloo) and use GPU LOCAL_RANK
    (the one GPU this process sees, where CUDA_VISIBLE_DEVICES shows each rank its own).

    Returns whether this process is one rank of several. An existing process group is kept.
    torchrun's variables are checked first (ConfigError naming the one missing or wrong); a rank that
    cannot reach rank 0's address (MASTER_ADDR:MASTER_PORT) within `timeout`, or then meet the other
    ranks within `timeout`, raises DistributedError (step "join") instead of waiting on.
    """
    wait = _timedelta(timeout)
    ranks = torchrun_ranks(os.environ, rendezvous=not dist.is_initialized())
    if ranks.size == 1:
        return False
    device = _local_device(ranks.local_rank)  # before joining: a rank without its GPU joins no group
    if not dist.is_initialized():
        _join(ranks, wait)
    if device is not None:
        import torch

        torch.cuda.set_device(device)
    return dist.get_world_size() > 1


def _local_device(local_rank: int) -> int | None:
    """The CUDA device of the rank LOCAL_RANK on its node (None without CUDA): device LOCAL_RANK,
    or the one device this process sees (CUDA_VISIBLE_DEVICES set per rank, as srun
    --gpus-per-task=1 does); ConfigError naming LOCAL_RANK where it sees several, but not that many."""
    import torch

    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    if local_rank < count:
        return local_rank
    if count == 1:
        return 0
    raise ConfigError("LOCAL_RANK", str(local_rank), f"must be below the {count} CUDA devices this process sees "
                      f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}): one GPU per rank of a node, "
                      "or one visible device per rank")


def _join(ranks: Ranks, wait: datetime.timedelta) -> None:
    seconds = wait.total_seconds()
    # Torch's store client retries past the timeout it is given, so the other ranks first wait for
    # the address here.
    if not hosts_store(ranks.rank, os.environ):
        why = wait_for_address(ranks.address, ranks.port, seconds)
        if why:
            raise DistributedError("join", f"rank {ranks.rank} could not reach rank 0 at MASTER_ADDR:MASTER_PORT="
                                   f"{ranks.address}:{ranks.port} within {seconds:g} s: {why}")
    try:
        dist.init_process_group("gloo", timeout=wait)
    except (RuntimeError, ValueError) as err:
        raise DistributedError("join", f"rank {ranks.rank} did not meet the other ranks within {seconds:g} s: "
                               f"{first_line(err)}") from err


def leave(timeout: float | datetime.timedelta = DEFAULT_TIMEOUT_S) -> None:
    """Wait (at most `timeout`) until every rank is done, then destroy the process groups (the job's
    and this package's); DistributedError when some rank did not arrive (the groups are destroyed
    all the same). Nothing to do without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        # No rank tears gloo down while another still uses it (its peer would see a closed connection);
        # an exchange, not a bare barrier, so a rank still at another step hears that this one left.
        Communicator(None, timeout).exchange("leave", lambda: None)
    finally:
        _gloo_groups.forget()
        dist.destroy_process_group()
