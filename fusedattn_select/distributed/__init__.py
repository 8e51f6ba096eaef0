"""Many ranks, one answer: agreement and shared warmup over torch.distributed (needs torch).

    agree(configs, group=None)    every rank holds the same Selection per problem, or NONE saying
                                  which ranks answered what, on which platform
    warmup(configs, depth, group) the ranks split the distinct problems, warm their shares once,
                                  and share decisions (and serialized plans across stores)

Only these calls communicate, and each of them only through Communicator.exchange (group.py):
the hot path (select(), attention()) never does. A rank that raises inside them makes every rank
raise DistributedError naming it; a rank that does not arrive within `timeout` makes the others
raise instead of hanging. Without an initialised process group (or with a group of one rank) they
work locally. The package `fusedattn_select` does not import this module: import it explicitly.
"""

from fusedattn_select.distributed.agreement import AgreementReport, Disagreement, PlatformGroup, agree
from fusedattn_select.distributed.group import (
    DEFAULT_TIMEOUT_S,
    Communicator,
    DistributedError,
    RankFailure,
    init_from_torchrun,
)
from fusedattn_select.distributed.shared_warmup import Received, SharedWarmupReport, warmup
from fusedattn_select.distributed.work import WorkItem, split, work_items

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "AgreementReport",
    "Communicator",
    "Disagreement",
    "DistributedError",
    "PlatformGroup",
    "RankFailure",
    "Received",
    "SharedWarmupReport",
    "WorkItem",
    "agree",
    "init_from_torchrun",
    "split",
    "warmup",
    "work_items",
]
