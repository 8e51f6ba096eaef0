"""Export and import: a round trip between store kinds, rows of one fingerprint only, every row verified."""

import base64
import json

import pytest
from store_samples import H100, H200, KEY, REJECTED_FAST, SUPPORTED_FAST, SUPPORTED_FULL

from fusedattn_select.store import CacheError, ImportReport, MemoryStore, PersistentStore
from fusedattn_select.types import ProbeDepth


# ----- export and import ------------------------------------------------------------------------
def _filled(store):
    store.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    store.put(H100, "rejected", REJECTED_FAST, ProbeDepth.FAST)
    store.put(H200, KEY, REJECTED_FAST, ProbeDepth.FAST)
    store.put_plan(H100, "plan-fwd", b"\x00\x01plan bytes" * 50)
    return store


def test_export_import_round_trip(store, tmp_path):
    exported = _filled(store).export(tmp_path / "decisions.json")
    assert (exported["verdicts"], exported["plans"]) == (3, 1)
    target = MemoryStore() if isinstance(store, PersistentStore) else PersistentStore(tmp_path / "other")
    report = target.import_(tmp_path / "decisions.json")
    assert report == ImportReport(verdicts=3, plans=1)
    assert target.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)
    assert target.get(H100, "rejected") == (REJECTED_FAST, ProbeDepth.FAST)
    assert target.get(H200, KEY) == (REJECTED_FAST, ProbeDepth.FAST)
    assert target.get_plan(H100, "plan-fwd") == b"\x00\x01plan bytes" * 50


def test_import_for_one_fingerprint_skips_foreign_rows(cache_dir, tmp_path):
    _filled(PersistentStore(cache_dir)).export(tmp_path / "decisions.json")
    target = MemoryStore()
    report = target.import_(tmp_path / "decisions.json", fingerprint=H200)
    assert (report.verdicts, report.plans) == (1, 0)
    assert len(report.skipped) == 3
    assert all("foreign fingerprint" in reason for _, reason in report.skipped)
    assert target.get(H200, KEY) == (REJECTED_FAST, ProbeDepth.FAST)
    assert target.get(H100, KEY) is None


def test_import_verifies_rows(cache_dir, tmp_path):
    path = tmp_path / "decisions.json"
    _filled(PersistentStore(cache_dir)).export(path)
    document = json.loads(path.read_text())
    plan = document["plans"][0]
    plan["blob"] = base64.b64encode(base64.b64decode(plan["blob"])[:-1] + b"X").decode()
    rows = {(row["fingerprint"], row["key"]): row for row in document["verdicts"]}
    rows[H100.key(), KEY]["verdicts"][0]["outcome"] = "failed"
    rows[H100.key(), "rejected"]["verdicts"] = "garbage"
    forged = dict(document["fingerprints"][H200.key()], device_name="NVIDIA B200")
    document["fingerprints"][H200.key()] = forged
    path.write_text(json.dumps(document))
    report = MemoryStore().import_(path)
    assert (report.verdicts, report.plans) == (0, 0)
    reasons = " | ".join(reason for _, reason in report.skipped)
    assert "sha256" in reasons
    assert "FAILED" in reasons
    assert "not a non-empty list" in reasons
    assert "hashes to" in reasons


def test_import_of_a_file_that_is_not_an_export_raises(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"hello": "world"}))
    with pytest.raises(CacheError, match="format"):
        MemoryStore().import_(path)


@pytest.mark.parametrize("exported, imported", [(SUPPORTED_FAST, False), (REJECTED_FAST, True)],
                         ids=["a fast yes is skipped", "a rejection replaces it and counts"])
def test_import_over_a_stored_full_yes(cache_dir, tmp_path, exported, imported):
    # A deeper decision is kept over a shallower yes; a rejection answers every depth, so it replaces any.
    source = MemoryStore()
    source.put(H100, KEY, exported, ProbeDepth.FAST)
    source.export(tmp_path / "fast.json")
    target = PersistentStore(cache_dir)
    target.put(H100, KEY, SUPPORTED_FULL, ProbeDepth.FULL)
    report = target.import_(tmp_path / "fast.json")
    if imported:
        assert (report.verdicts, report.skipped) == (1, ())
        assert target.get(H100, KEY) == (REJECTED_FAST, ProbeDepth.FAST)
    else:
        assert report.verdicts == 0 and "a deeper decision is already stored" in report.skipped[0][1]
        assert target.get(H100, KEY) == (SUPPORTED_FULL, ProbeDepth.FULL)
