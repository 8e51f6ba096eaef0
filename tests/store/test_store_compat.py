"""A store written by the released code (tests/data/store-v1, made at commit dadc6b2) is read as written.

The directory holds decisions.sqlite3 and expected.json: the fingerprint, the verdicts of each
cache key and each plan blob (hex) that the released code stored.
"""

import json
import os
import shutil
from pathlib import Path

import pytest

from fusedattn_select.store import PersistentStore
from fusedattn_select.types import Fingerprint, Verdict

RELEASED_STORE = Path(__file__).resolve().parents[1] / "data" / "store-v1"
EXPECTED = json.loads((RELEASED_STORE / "expected.json").read_text())
FINGERPRINT = Fingerprint.from_dict(EXPECTED["fingerprint"])


@pytest.fixture
def released_store(tmp_path):
    """The released store, copied (never opened in place) into a private directory so plans are allowed."""
    directory = tmp_path / "store-v1"
    shutil.copytree(RELEASED_STORE, directory)
    os.chmod(directory, 0o700)
    for path in directory.iterdir():
        os.chmod(path, 0o600)
    return PersistentStore(directory)


@pytest.mark.parametrize("key", sorted(EXPECTED["decisions"]))
def test_every_released_decision_reads_back_equal(released_store, key):
    entry = released_store.get(FINGERPRINT, key)
    assert entry is not None
    verdicts, depth = entry
    assert verdicts == tuple(Verdict.from_dict(item) for item in EXPECTED["decisions"][key])
    assert {v.depth for v in verdicts} == {depth}


@pytest.mark.parametrize("plan_key", sorted(EXPECTED["plans"]))
def test_every_released_plan_reads_back_byte_for_byte(released_store, plan_key):
    assert released_store.plans_enabled
    assert released_store.get_plan(FINGERPRINT, plan_key) == bytes.fromhex(EXPECTED["plans"][plan_key])


def test_released_store_counts_match(released_store):
    info = released_store.info()
    assert (info["kind"], info["entries"], info["plans"]) == ("sqlite", len(EXPECTED["decisions"]), len(EXPECTED["plans"]))
    assert info["path"] == str(released_store.path)


def test_released_store_takes_new_decisions_beside_the_old(released_store):
    old_key = sorted(EXPECTED["decisions"])[0]
    old_entry = released_store.get(FINGERPRINT, old_key)
    new_verdicts = tuple(Verdict.from_dict(item) for item in EXPECTED["decisions"][old_key])
    assert released_store.put(FINGERPRINT, "key-added-later", new_verdicts, old_entry[1])
    assert released_store.get(FINGERPRINT, "key-added-later") == old_entry
    assert released_store.get(FINGERPRINT, old_key) == old_entry
    assert released_store.info()["entries"] == len(EXPECTED["decisions"]) + 1
    assert released_store.integrity_check() == ["ok"]

