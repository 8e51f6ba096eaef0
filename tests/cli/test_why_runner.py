"""`why` and the transformers report say which runner was measured faster for a problem's graphs,
read from the store where attention() persisted it (selection/runners.py); nothing when none was."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from fusedattn_select.config import AttnConfig
from fusedattn_select.config_files import load_config_file
from fusedattn_select.probing import choose_engine
from fusedattn_select.plan_store.calls import dispatch_config
from fusedattn_select.selection import runners
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store import PersistentStore
from fusedattn_select.cli.why import format_selection

ROOT = Path(__file__).resolve().parents[2]
CFG: AttnConfig = load_config_file(ROOT / "configs" / "llama-3-8b.yaml").entries[0].config  # recorded in the snapshot


def _selector(tmp_path) -> Selector:
    # A recorded engine (the bundled H100 snapshot) with a persistent store: answers by the problem's own graphs.
    directory = tmp_path / "store"
    directory.mkdir(mode=0o700)
    return Selector(choose_engine(target="h100").engine, store=PersistentStore(str(directory)))


def test_a_stored_choice_is_found_for_the_graphs_the_problem_runs(tmp_path):
    selector = _selector(tmp_path)
    selection = selector.select(CFG)
    assert selection.selected, selection.message
    assert runners.for_selection(selector, selection) is None  # not measured yet: nothing said
    key = runners.runner_key(dispatch_config(CFG).cache_key())
    assert runners.store(selector, key, runners.Choice(runners.TORCH, 12.5, 20.0))
    found = runners.for_selection(selector, selection)
    assert found == runners.Choice(runners.TORCH, 12.5, 20.0)
    lines = format_selection("p", selection, runner=found)
    assert lines[-1] == "  runner: torch SDPA (measured torch 12.5 us vs cuDNN 20.0 us per forward call)"


def test_a_choice_for_another_problem_or_a_bad_blob_is_not_used(tmp_path):
    selector = _selector(tmp_path)
    selection = selector.select(CFG)
    other = dispatch_config(CFG.replace(num_heads_q=8, num_heads_kv=8)).cache_key()
    runners.store(selector, runners.runner_key(other), runners.Choice(runners.CUDNN, 30.0, 10.0))
    assert runners.for_selection(selector, selection) is None
    key = runners.runner_key(dispatch_config(CFG).cache_key())
    conn = sqlite3.connect(selector.store.path, isolation_level=None)  # a damaged row
    conn.execute("INSERT INTO runner_choices VALUES (?, ?, 'not json', 10, 0, 0)", (selector.fingerprint.key(), key))
    conn.close()
    assert runners.for_selection(selector, selection) is None
    assert os.path.isdir(tmp_path / "store")
