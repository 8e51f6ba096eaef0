"""distributed.warmup and distributed.agree take and refuse what selection.warmup does: a ConfigFile,
one problem or an iterable of them, a Selector, a progress function and a jobs count, with the same
ConfigError naming the argument, raised before anything is probed or exchanged.

In-process without a process group (one rank); the engine is the conftest's RecordingTestEngine, a
test double that probes nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from fusedattn_select import distributed  # noqa: E402
from fusedattn_select.config import AttnConfig  # noqa: E402
from fusedattn_select.config_files import NamedConfig, load_config_file  # noqa: E402
from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.selection import local_warmup  # noqa: E402
from fusedattn_select.selection.selector import Selector  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CFG = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128)
GPT2 = load_config_file(ROOT / "configs" / "gpt2.yaml")


def warmed_names(warm, configs, engine) -> list[str]:
    report = warm(configs, depth="fast", selector=Selector(engine))
    rows = report.combined.rows if isinstance(report, distributed.SharedWarmupReport) else report.rows
    return [row.name for row in rows]


@pytest.mark.parametrize("configs", [GPT2, GPT2.entries, ("one", CFG), CFG, NamedConfig("named", CFG)],
                         ids=["ConfigFile", "entries", "pair", "AttnConfig", "NamedConfig"])
def test_distributed_warmup_and_agree_take_what_warmup_takes(recording_engine, configs):
    # A ConfigFile was a TypeError in agree(), and one (name, config) pair was read as two items
    # (configs[0]='one').
    local = warmed_names(local_warmup.warmup, configs, recording_engine)
    assert warmed_names(distributed.warmup, configs, recording_engine) == local
    agreed = distributed.agree(configs, selector=Selector(recording_engine))
    assert agreed.agreed and set(agreed.selections) >= set(local)
    if configs is GPT2:
        assert list(agreed.selections) == list(dict.fromkeys(entry.name for entry in GPT2.entries))


def local_error(call) -> ConfigError:
    with pytest.raises(ConfigError) as raised:
        call()
    return raised.value


@pytest.mark.parametrize("configs", [None, 5, "configs/gpt2.yaml", {"a": CFG}, b"x", ["not a config"], [("x", 1)]])
def test_distributed_warmup_and_agree_refuse_the_configs_warmup_refuses(recording_engine, configs):
    expected = local_error(lambda: local_warmup.warmup(configs, selector=Selector(recording_engine)))
    for call in (lambda: distributed.warmup(configs, selector=Selector(recording_engine)),
                 lambda: distributed.agree(configs, selector=Selector(recording_engine))):
        err = local_error(call)
        assert (err.field, err.value, err.allowed) == (expected.field, expected.value, expected.allowed)
    assert recording_engine.calls == 0


@pytest.mark.parametrize("argument, value", [("selector", "x"), ("selector", object()), ("progress", "x"),
                                             ("progress", 3), ("jobs", 0), ("jobs", "2"), ("jobs", True)])
def test_distributed_warmup_checks_its_arguments_as_warmup_does_before_anything(recording_engine, argument, value):
    # selector='x' was an AttributeError from inside the first exchange; jobs and progress failed
    # only in the rank's share, after the ranks had exchanged their facts.
    kwargs = {"selector": Selector(recording_engine), argument: value}
    expected = local_error(lambda: local_warmup.warmup([CFG], **kwargs))
    err = local_error(lambda: distributed.warmup([CFG], **kwargs))
    assert (err.field, err.allowed) == (expected.field, expected.allowed) and err.field == argument
    if argument == "selector":
        err = local_error(lambda: distributed.agree([CFG], selector=value))
        assert (err.field, err.allowed) == (expected.field, expected.allowed)
    assert recording_engine.calls == 0
