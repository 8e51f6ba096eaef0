"""`cache export` where plans are refused (a cache directory others can write) says that the plans it
holds were not exported, and exits 1: the export holds the decisions only."""

import json
import os

from fusedattn_select import cli
from fusedattn_select.store import PersistentStore
from fusedattn_select.types import ProbeDepth
from store_samples import H100, verdicts


def _store_with_a_plan(directory):
    store = PersistentStore(directory)
    assert store.put(H100, "key-1", verdicts(), ProbeDepth.FULL)
    assert store.put_plan(H100, "plan-1", b"plan bytes" * 10)
    store.close()


def test_cache_export_of_refused_plans_exits_1_naming_them(capsys, tmp_path):
    directory = tmp_path / "cache"  # the test's FUSEDATTN_SELECT_CACHE_DIR (tests/conftest.py)
    _store_with_a_plan(directory)
    os.chmod(directory, 0o770)
    target = tmp_path / "export.json"
    code = cli.main(["cache", "export", str(target)])
    out, err = capsys.readouterr()
    assert code == 1
    assert json.loads(out)["plans"] == 0 and json.loads(out)["verdicts"] == 1
    written = json.loads(target.read_text())
    assert len(written["verdicts"]) == 1 and written["plans"] == []
    assert "error: cache export: 1 plans were not exported" in err
    assert "writable by group or others (mode 770)" in err


def test_cache_export_to_stdout_of_refused_plans_exits_1(capsys, tmp_path):
    directory = tmp_path / "cache"
    _store_with_a_plan(directory)
    os.chmod(directory, 0o770)
    code = cli.main(["cache", "export", "-"])
    out, err = capsys.readouterr()
    assert code == 1 and json.loads(out)["plans"] == []
    assert "1 plans were not exported" in err


def test_cache_export_of_a_trusted_store_exits_0(capsys, tmp_path):
    directory = tmp_path / "cache"
    _store_with_a_plan(directory)
    os.chmod(directory, 0o700)
    code = cli.main(["cache", "export", str(tmp_path / "export.json")])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["plans"] == 1 and "error" not in err
