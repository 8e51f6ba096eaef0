"""clear_cache() clears what the process holds and, with persistent=True, the default store, whichever
engine answers the process (a snapshot, or none yet chosen): it chooses and starts no engine to do so,
and says so where the store cannot be cleared."""

from __future__ import annotations

import pytest

import fusedattn_select
from fusedattn_select.errors import ConfigError
from fusedattn_select.selection import selector as selector_module
from fusedattn_select.store import PersistentStore
from fusedattn_select.store.protocol import CacheError
from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, ProbeDepth, Provenance, Verdict

FP = Fingerprint(platform="cuda", device_name="Test GPU", compute_capability="9.0", sm_count=132,
                 cudnn_backend_version=91900, cudnn_frontend_version="1.32.0", driver_version="580",
                 library_version="test")
YES = Verdict(Backend.F16, Phase.FORWARD, Outcome.SUPPORTED, "", "", "", Provenance.LIVE_PROBE, ProbeDepth.FAST)


def _stored(tmp_path) -> PersistentStore:
    store = PersistentStore(tmp_path / "cache")
    assert store.put(FP, "key-1", [YES], ProbeDepth.FAST) and store.info()["entries"] == 1
    return store


def test_clearing_memory_chooses_no_engine(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDATTN_SELECT_SNAPSHOT", str(tmp_path / "gone.json"))  # choosing would refuse it
    fusedattn_select.clear_cache()
    assert selector_module._default is None


def test_persistent_clears_the_default_store_where_a_snapshot_answers(tmp_path):
    store = _stored(tmp_path)
    fusedattn_select.use_snapshots(target="h100")  # its selector holds no store: snapshots are not stored
    fusedattn_select.clear_cache(persistent=True)
    assert store.info()["entries"] == 0
    _stored(tmp_path)
    selector_module.set_default_selector(None)
    fusedattn_select.clear_cache(persistent=True)  # no selector yet
    assert store.info()["entries"] == 0 and selector_module._default is None


def test_a_store_that_cannot_be_used_is_an_error_not_a_cleared_memory(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(CacheError, match="cannot be cleared"):
        fusedattn_select.clear_cache(persistent=True)
    with pytest.raises(ConfigError, match="persistent"):
        fusedattn_select.clear_cache(persistent="no")
