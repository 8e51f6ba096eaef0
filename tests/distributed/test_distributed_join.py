"""Joining a torchrun job: torchrun's variables are checked by the one checker the command line uses,
and a rank that cannot meet the others gives up after `timeout` with a DistributedError.

No rank here ever meets another: each test's rendezvous port is free (nobody listens), so no
process group is formed in the test process.
"""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("torch.distributed")

from fusedattn_select import distributed  # noqa: E402
from fusedattn_select.errors import ConfigError  # noqa: E402

TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def torchrun_env(monkeypatch):
    """Sets torchrun's variables as given (the others unset)."""
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


@pytest.mark.parametrize(("env", "named"), [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc': must be a positive whole number"),
    ({"WORLD_SIZE": "2", "RANK": "5", "LOCAL_RANK": "0"}, "RANK='5': must be a whole number from 0 to WORLD_SIZE-1"),
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"},
     "MASTER_PORT='0': must be a port number from 1 to 65535"),
])
def test_init_from_torchrun_names_a_torchrun_variable_that_is_wrong(torchrun_env, env, named):
    torchrun_env(**{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **env})
    with pytest.raises(ConfigError) as raised:
        distributed.init_from_torchrun(timeout=1)
    assert str(raised.value).startswith(named), raised.value


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_that_cannot_meet_the_others_gives_up_after_the_timeout(torchrun_env, rank):
    # Rank 1 finds no rank 0 at the address; rank 0 hosts the store and no rank 1 comes.
    torchrun_env(WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(free_port()))
    started = time.monotonic()
    with pytest.raises(distributed.DistributedError) as raised:
        distributed.init_from_torchrun(timeout=2)
    waited = time.monotonic() - started
    assert raised.value.step == "join" and "within 2 s" in str(raised.value)
    assert waited < 5, waited  # torch's own store client, given 2 s, retries for longer
