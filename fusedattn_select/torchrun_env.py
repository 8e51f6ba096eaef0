"""torchrun's variables (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): their one checker.

Torch-free, so the command line checks them before it imports anything, and
`distributed.init_from_torchrun` checks them the same way before it joins a process group. Also the
rendezvous deadline's first half: waiting, with a deadline, until rank 0's address answers (torch's
own TCP store client retries past the timeout it is given, so it is only asked once the address is up).
"""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass
from typing import Iterable, Mapping

from fusedattn_select.errors import ConfigError

# Pause between connection attempts to rank 0's address: short against any useful deadline.
RETRY_PAUSE_S = 0.25
# Ranks wait for the slowest rank's local step (a warmup share at depth full takes seconds to
# minutes); a rank absent this long is taken to be lost.
DEFAULT_TIMEOUT_S = 600.0


def ranks_phrase(ranks: Iterable[int]) -> str:
    """"rank 3" or "ranks 0, 2"."""
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def hosts_store(rank: int, environ: Mapping[str, str]) -> bool:
    """Whether this rank hosts the job's TCP store, as env:// decides: rank 0, unless torchrun's agent does."""
    return rank == 0 and environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"


@dataclass(frozen=True)
class Ranks:
    """This process's place in a torchrun job: `size` 1 (rank 0) when it is not one of several.

    `address` and `port` are where the ranks meet (MASTER_ADDR, MASTER_PORT); "" and 0 when they
    were not asked for."""

    size: int = 1
    rank: int = 0
    local_rank: int = 0
    address: str = ""
    port: int = 0


def _whole_number(environ: Mapping[str, str], name: str, low: int, high: int | None, allowed: str) -> int:
    """Environment variable `name` as a whole number in [low, high]; ConfigError naming it otherwise
    (unset: its value shows as None)."""
    text = environ.get(name)
    digits = text.strip() if text is not None else ""
    # At most 18 digits: int() of a hostile value of thousands of digits raises ValueError itself.
    value = int(digits) if re.fullmatch(r"[0-9]{1,18}", digits) else -1
    if value < low or (high is not None and value > high):
        raise ConfigError(name, text, allowed if text is not None else f"not set; {allowed}")
    return value


def torchrun_ranks(environ: Mapping[str, str], rendezvous: bool = True) -> Ranks:
    """WORLD_SIZE, RANK and LOCAL_RANK as torchrun sets them; ConfigError naming the first that is
    missing or wrong. WORLD_SIZE unset, empty or 1 is one process (the others are not read). With
    `rendezvous` (the ranks will form a process group) MASTER_ADDR and MASTER_PORT are checked too."""
    if not environ.get("WORLD_SIZE", "").strip():
        return Ranks()
    size = _whole_number(environ, "WORLD_SIZE", 1, None, "must be a positive whole number, the number of ranks "
                         "of the job (torchrun sets it; unset for one process)")
    if size == 1:
        return Ranks()
    within = f"from 0 to WORLD_SIZE-1 ({size - 1} here)"
    rank = _whole_number(environ, "RANK", 0, size - 1, f"must be a whole number {within}, this process's rank "
                         f"among the WORLD_SIZE={size} ranks (torchrun sets it)")
    local_rank = _whole_number(environ, "LOCAL_RANK", 0, size - 1, f"must be a whole number {within}, this "
                               "process's rank on its node, which picks its GPU (torchrun sets it)")
    if not rendezvous:
        return Ranks(size, rank, local_rank)
    address = environ.get("MASTER_ADDR")
    if not (address or "").strip():
        allowed = f"must name the host of rank 0 for the WORLD_SIZE={size} ranks to meet (torchrun sets it)"
        raise ConfigError("MASTER_ADDR", address, allowed if address is not None else f"not set; {allowed}")
    port = _whole_number(environ, "MASTER_PORT", 1, 65535, "must be a port number from 1 to 65535 on the host of "
                         "rank 0 (torchrun sets it)")
    return Ranks(size, rank, local_rank, address.strip(), port)


def wait_for_address(address: str, port: int, timeout_s: float) -> str:
    """Wait up to `timeout_s` until something accepts connections at `address`:`port` (rank 0's store,
    or torchrun's); "" once it does, else why not (the last connection error)."""
    deadline = time.monotonic() + timeout_s
    last = "no attempt"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return last
        try:
            with socket.create_connection((address, port), timeout=min(left, 5.0)):
                return ""
        except OSError as err:  # refused, unreachable, not resolvable (yet): try again until the deadline
            last = f"{type(err).__name__}: {err}"
        time.sleep(min(RETRY_PAUSE_S, max(0.0, deadline - time.monotonic())))
