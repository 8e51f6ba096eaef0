"""Arguments of the selection API that are not what they must be: a ConfigError naming the argument,
raised before anything is probed, cleared or chosen, never a TypeError from inside nor a truthy
string read as True.

The engine is the conftest's RecordingTestEngine, a test double that probes nothing; the snapshots
named by target are the real bundled ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fusedattn_select
from fusedattn_select import AttnConfig, clear_cache, select, use_snapshots, warmup
from fusedattn_select.config_files import load_config_file
from fusedattn_select.errors import ConfigError
from fusedattn_select.selection.selector import Selector, default_selector, set_default_selector
from fusedattn_select.store import PersistentStore

ROOT = Path(__file__).resolve().parents[2]
CFG = AttnConfig(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128)
# Refused by the test engine (head dim above 256): a NONE, for which alternatives=True would probe more.
REFUSED = CFG.replace(head_dim_qk=512, is_training=False)


@pytest.fixture
def stored(tmp_path, recording_engine):
    """The process-wide selector over a persistent store that holds one answer."""
    directory = tmp_path / "store"
    directory.mkdir(mode=0o700)
    selector = Selector(recording_engine, store=PersistentStore(directory))
    set_default_selector(selector)
    select(CFG)
    assert selector.store.info()["entries"] >= 1
    return selector


# ----- clear_cache / Selector.clear ------------------------------------------------------------
@pytest.mark.parametrize("persistent", ["no", "false", 1, 0, None])
def test_clear_cache_takes_only_a_bool_and_keeps_the_store(stored, persistent):
    entries = stored.store.info()["entries"]
    with pytest.raises(ConfigError) as raised:
        clear_cache(persistent=persistent)
    assert raised.value.field == "persistent" and "True" in raised.value.allowed
    assert stored.store.info()["entries"] == entries  # "no" used to wipe the persistent store
    assert fusedattn_select.cache_info()["entries"] == 1  # nor was memory cleared


def test_clear_cache_with_bools_still_clears(stored):
    clear_cache(persistent=False)
    assert fusedattn_select.cache_info()["entries"] == 0 and stored.store.info()["entries"] >= 1
    clear_cache(persistent=True)
    assert stored.store.info()["entries"] == 0


# ----- select(alternatives=...) -----------------------------------------------------------------
@pytest.mark.parametrize("value", ["no", 1, None])
def test_select_takes_only_a_bool_for_alternatives(recording_engine, value):
    set_default_selector(Selector(recording_engine))
    with pytest.raises(ConfigError) as raised:
        select(REFUSED, alternatives=value)
    assert raised.value.field == "alternatives"
    assert recording_engine.calls == 0  # "no" used to probe the problem and its alternatives
    assert select(REFUSED, alternatives=False).alternatives == ()


# ----- warmup -------------------------------------------------------------------------------------
def test_warmup_takes_a_config_file_as_its_entries(recording_engine):
    config_file = load_config_file(ROOT / "configs" / "gpt2.yaml")
    report = warmup(config_file, depth="fast", selector=Selector(recording_engine))
    as_entries = warmup(config_file.entries, depth="fast", selector=Selector(recording_engine))
    assert [row.name for row in report.rows] == [row.name for row in as_entries.rows]
    assert len(report.rows) + report.duplicates == len(config_file.entries)


@pytest.mark.parametrize("configs", [None, 5, "configs/gpt2.yaml", {"a": CFG}, b"x"])
def test_warmup_names_configs_that_are_no_problems(recording_engine, configs):
    with pytest.raises(ConfigError) as raised:
        warmup(configs, selector=Selector(recording_engine))
    assert raised.value.field == "configs" and "ConfigFile" in raised.value.allowed
    assert recording_engine.calls == 0


def test_warmup_takes_one_named_pair(recording_engine):
    report = warmup(("one", CFG), depth="fast", selector=Selector(recording_engine))
    assert [row.name for row in report.rows] == ["one"]


@pytest.mark.parametrize("argument, value", [("progress", "x"), ("progress", 3), ("selector", "x"),
                                             ("selector", object())])
def test_warmup_checks_progress_and_selector_before_probing(recording_engine, argument, value):
    kwargs = {"selector": Selector(recording_engine), argument: value}
    set_default_selector(Selector(recording_engine))
    with pytest.raises(ConfigError) as raised:
        warmup([CFG, CFG.replace(head_dim_qk=64)], **kwargs)
    assert raised.value.field == argument
    assert recording_engine.calls == 0  # progress="x" used to fail only after every probe


# ----- use_snapshots ------------------------------------------------------------------------------
@pytest.mark.parametrize("snapshots, field", [(5, "snapshots"), (b"x.json", "snapshots"), ({"x.json": 1}, "snapshots"),
                                              ([3], "snapshots[0]"), (["a.json", None], "snapshots[1]")])
def test_use_snapshots_names_what_is_no_path(snapshots, field):
    with pytest.raises(ConfigError) as raised:
        use_snapshots(snapshots)
    assert raised.value.field == field and "path" in raised.value.allowed


@pytest.mark.parametrize("snapshots, field", [("", "snapshots"), ([""], "snapshots[0]")])
def test_use_snapshots_says_an_empty_path_names_no_file(snapshots, field):
    before = default_selector()
    for target in (None, "h100"):
        with pytest.raises(ConfigError) as raised:
            use_snapshots(snapshots, target=target)
        assert raised.value.field == field and "empty path" in raised.value.allowed
        assert "not both" not in str(raised.value)  # no file was given
    assert default_selector() is before


def test_use_snapshots_with_no_files_and_a_target_uses_the_target():
    selector = use_snapshots([], target="h100")
    assert selector.engine_name.startswith("snapshot:h100-")

