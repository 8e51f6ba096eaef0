"""Runner choices are rows of their own kind: kept where serialized plans are refused, never counted
as plans, exported and imported, salvaged, written by many processes at once without loss, and
moved out of the plans table of a schema 1 store (which kept them there as `runner:` plan rows)."""

import base64
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_samples import H100, H200, KEY, SUPPORTED_FULL, race_writers_with_salvage, warnings_of

from fusedattn_select.store import DATABASE_NAME, MemoryStore, PersistentStore, database, schema
from fusedattn_select.store.protocol import SCHEMA_VERSION
from fusedattn_select.types import Fingerprint, ProbeDepth

TORCH_KEPT = {"runner": "torch", "torch_us": 9.5, "cudnn_us": 12.25}
CUDNN_KEPT = {"runner": "cudnn", "torch_us": 30.0, "cudnn_us": 10.0}
RELEASED_STORE = Path(__file__).resolve().parents[1] / "data" / "store-v1"
RELEASED = json.loads((RELEASED_STORE / "expected.json").read_text())
RELEASED_FINGERPRINT = Fingerprint.from_dict(RELEASED["fingerprint"])


def _schema_1_store(directory: Path, runner_rows: dict[str, bytes]) -> Path:
    """The released schema 1 store (tests/data/store-v1), with `runner:<key>` plan rows as schema 1
    code wrote them."""
    shutil.copytree(RELEASED_STORE, directory)
    os.chmod(directory, 0o700)
    for path in directory.iterdir():
        os.chmod(path, 0o600)
    conn = sqlite3.connect(directory / DATABASE_NAME, isolation_level=None)
    fp_key = RELEASED_FINGERPRINT.key()
    for key, blob in runner_rows.items():
        conn.execute("INSERT INTO plans (fingerprint_key, plan_key, sha256, size, created, last_used, blob)"
                     " VALUES (?, ?, ?, ?, 1.0, 2.0, ?)",
                     (fp_key, schema.LEGACY_RUNNER_PREFIX + key, hashlib.sha256(blob).hexdigest(), len(blob), blob))
    assert schema.schema_version(conn) == 1
    conn.close()
    return directory


# ----- rows of their own ------------------------------------------------------------------------
def test_a_runner_choice_round_trips_under_its_fingerprint_only(store):
    assert store.get_runner_choice(H100, KEY) is None
    assert store.put_runner_choice(H100, KEY, TORCH_KEPT)
    assert store.get_runner_choice(H100, KEY) == TORCH_KEPT
    assert store.get_runner_choice(H200, KEY) is None
    assert store.put_runner_choice(H100, KEY, CUDNN_KEPT)  # measured again: replaced
    assert store.get_runner_choice(H100, KEY) == CUDNN_KEPT
    info = store.info()
    assert (info["entries"], info["plans"], info["runner_choices"]) == (0, 0, 1)


def test_a_runner_choice_survives_reopening_the_directory(cache_dir):
    assert PersistentStore(cache_dir).put_runner_choice(H100, KEY, TORCH_KEPT)
    assert PersistentStore(cache_dir).get_runner_choice(H100, KEY) == TORCH_KEPT
    assert PersistentStore(cache_dir, read_only=True).get_runner_choice(H100, KEY) == TORCH_KEPT


@pytest.mark.parametrize("choice", [
    {"runner": "torch", "torch_us": 1.0}, {**TORCH_KEPT, "extra": 1}, {**TORCH_KEPT, "runner": ""},
    {**TORCH_KEPT, "torch_us": -1.0}, {**TORCH_KEPT, "cudnn_us": float("nan")}, {**TORCH_KEPT, "torch_us": True},
    {**TORCH_KEPT, "cudnn_us": "fast"}, ["torch", 1.0, 2.0],
])
def test_what_is_not_a_runner_choice_is_refused_naming_the_field(store, choice):
    with pytest.raises(ValueError):
        store.put_runner_choice(H100, KEY, choice)
    assert store.info()["runner_choices"] == 0


def test_a_directory_that_refuses_plans_keeps_runner_choices(cache_dir):
    os.chmod(cache_dir, 0o770)  # group-shared: plans load native code and are refused
    store = PersistentStore(cache_dir)
    assert not store.plans_enabled
    assert store.put_runner_choice(H100, KEY, TORCH_KEPT)
    assert PersistentStore(cache_dir).get_runner_choice(H100, KEY) == TORCH_KEPT


def test_a_runner_choice_row_that_does_not_parse_is_dropped_with_a_warning(cache_dir, caplog):
    store = PersistentStore(cache_dir)
    assert store.put_runner_choice(H100, KEY, TORCH_KEPT)
    store.close()
    conn = sqlite3.connect(store.path, isolation_level=None)
    conn.execute("UPDATE runner_choices SET choice = '{\"runner\": \"torch\"}'")
    conn.close()
    caplog.set_level(logging.WARNING, logger="fusedattn_select")
    assert store.get_runner_choice(H100, KEY) is None
    assert len(warnings_of(caplog)) == 1 and "runner choice" in warnings_of(caplog)[0].getMessage()
    assert store.info()["runner_choices"] == 0


def test_clear_removes_runner_choices(store):
    assert store.put_runner_choice(H100, KEY, TORCH_KEPT)
    store.clear()
    assert store.get_runner_choice(H100, KEY) is None and store.info()["runner_choices"] == 0


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_eviction_takes_plans_before_older_runner_choices_and_decisions(kind, cache_dir):
    store = PersistentStore(cache_dir, max_bytes=5000) if kind == "sqlite" else MemoryStore(max_bytes=5000)
    assert store.put(H100, "decision", SUPPORTED_FULL, ProbeDepth.FULL)
    assert store.put_runner_choice(H100, "choice", TORCH_KEPT)
    time.sleep(0.002)
    assert store.put_plan(H100, "old-plan", b"p" * 2000)
    time.sleep(0.002)
    assert store.put_plan(H100, "new-plan", b"q" * 3000)  # over the bound: the older plan goes first
    assert store.get_plan(H100, "old-plan") is None
    assert store.get_runner_choice(H100, "choice") == TORCH_KEPT
    assert store.get(H100, "decision") is not None


# ----- export and import -------------------------------------------------------------------------
def test_export_import_round_trip_keeps_runner_choices(store, tmp_path):
    assert store.put_runner_choice(H100, KEY, TORCH_KEPT)
    assert store.put_runner_choice(H200, KEY, CUDNN_KEPT)
    assert store.export(tmp_path / "export.json")["runner_choices"] == 2
    other = MemoryStore()
    report = other.import_(tmp_path / "export.json")
    assert (report.runner_choices, report.plans, report.skipped) == (2, 0, ())
    assert other.get_runner_choice(H100, KEY) == TORCH_KEPT and other.get_runner_choice(H200, KEY) == CUDNN_KEPT


def test_an_edited_runner_choice_does_not_import(cache_dir, tmp_path):
    store = PersistentStore(cache_dir)
    assert store.put_runner_choice(H100, KEY, TORCH_KEPT)
    store.export(tmp_path / "export.json")
    document = json.loads((tmp_path / "export.json").read_text())
    document["runner_choices"][0]["choice"]["runner"] = "cudnn"
    (tmp_path / "export.json").write_text(json.dumps(document))
    report = MemoryStore().import_(tmp_path / "export.json")
    assert report.runner_choices == 0 and "does not match" in report.skipped[0][1]


def test_a_store_that_refuses_plans_imports_runner_choices(cache_dir, tmp_path):
    source = MemoryStore()
    assert source.put_runner_choice(H100, KEY, TORCH_KEPT) and source.put_plan(H100, "plan", b"plan bytes")
    source.export(tmp_path / "export.json")
    os.chmod(cache_dir, 0o770)
    report = PersistentStore(cache_dir).import_(tmp_path / "export.json")
    assert (report.runner_choices, report.plans) == (1, 0) and "plans refused" in report.skipped[0][1]
    assert PersistentStore(cache_dir).get_runner_choice(H100, KEY) == TORCH_KEPT


# ----- a schema 1 store --------------------------------------------------------------------------
def test_a_writer_upgrades_a_schema_1_store_moving_its_runner_choices_out_of_the_plans(tmp_path):
    directory = _schema_1_store(tmp_path / "v1", {"bucket-a": json.dumps(TORCH_KEPT).encode(),
                                                  "bucket-b": b"not json"})
    store = PersistentStore(directory)
    fingerprint = RELEASED_FINGERPRINT
    assert store.get_runner_choice(fingerprint, "bucket-a") == TORCH_KEPT
    assert store.get_runner_choice(fingerprint, "bucket-b") is None
    info = store.info()
    assert (info["entries"], info["plans"], info["runner_choices"]) == (
        len(RELEASED["decisions"]), len(RELEASED["plans"]), 1)
    for plan_key, blob in RELEASED["plans"].items():  # the real plans stay, byte for byte
        assert store.get_plan(fingerprint, plan_key) == bytes.fromhex(blob)
    conn = sqlite3.connect(store.path)
    assert schema.schema_version(conn) == SCHEMA_VERSION
    total = conn.execute("SELECT bytes FROM totals").fetchone()[0]
    assert total == sum(conn.execute(f"SELECT COALESCE(SUM(size), 0) FROM {table}").fetchone()[0]
                        for table in schema.PAYLOAD_TABLES)
    conn.close()
    assert store.integrity_check() == ["ok"]


def test_a_schema_1_store_opened_read_only_reads_its_runner_choices_and_stays_schema_1(tmp_path):
    directory = _schema_1_store(tmp_path / "v1", {"bucket-a": json.dumps(TORCH_KEPT).encode()})
    before = (directory / DATABASE_NAME).read_bytes()
    looking = PersistentStore(directory, read_only=True)
    assert looking.get_runner_choice(RELEASED_FINGERPRINT, "bucket-a") == TORCH_KEPT
    info = looking.info()
    assert (info["plans"], info["runner_choices"]) == (len(RELEASED["plans"]), 1)
    looking.export(tmp_path / "export.json")
    document = json.loads((tmp_path / "export.json").read_text())
    assert [row["key"] for row in document["runner_choices"]] == ["bucket-a"]
    assert all(not row["key"].startswith("runner:") for row in document["plans"])
    assert (directory / DATABASE_NAME).read_bytes() == before


def test_a_schema_1_export_imports_its_runner_choices_as_runner_choices(tmp_path):
    directory = _schema_1_store(tmp_path / "v1", {"bucket-a": json.dumps(CUDNN_KEPT).encode()})
    conn = sqlite3.connect(directory / DATABASE_NAME)
    rows = conn.execute("SELECT fingerprint_key, plan_key, sha256, size, blob FROM plans").fetchall()
    conn.close()
    document = {"format": "fusedattn-select-cache", "schema_version": 1, "fingerprints": {
        RELEASED_FINGERPRINT.key(): RELEASED["fingerprint"]}, "verdicts": [], "plans": [
        {"fingerprint": fp, "key": key, "sha256": digest, "size": size, "blob": base64.b64encode(blob).decode()}
        for fp, key, digest, size, blob in rows]}
    (tmp_path / "v1.json").write_text(json.dumps(document))
    store = MemoryStore()
    report = store.import_(tmp_path / "v1.json")
    assert (report.plans, report.runner_choices, report.skipped) == (len(RELEASED["plans"]), 1, ())
    assert store.get_runner_choice(RELEASED_FINGERPRINT, "bucket-a") == CUDNN_KEPT
    assert store.info()["plans"] == len(RELEASED["plans"])


# ----- salvage and many processes ----------------------------------------------------------------
def _damage_an_index(path: Path, index: str) -> None:
    conn = sqlite3.connect(path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()[0]
    conn.close()
    with open(path, "r+b") as handle:
        handle.seek((root - 1) * page_size)
        handle.write(b"\x55" * page_size)
    assert database.integrity_problem(path)


def test_a_salvage_keeps_every_runner_choice(cache_dir):
    store = PersistentStore(cache_dir)
    for index in range(200):
        assert store.put_runner_choice(H100, f"bucket-{index}", {**TORCH_KEPT, "torch_us": float(index)})
    store.close()
    _damage_an_index(store.path, "runner_choices_by_last_use")
    said = PersistentStore(cache_dir).repair()
    assert "200 runner choices; lost 0 rows" in said
    again = PersistentStore(cache_dir)
    assert all(again.get_runner_choice(H100, f"bucket-{index}")["torch_us"] == float(index) for index in range(200))


def test_a_salvage_of_a_damaged_schema_1_store_moves_its_runner_choices(tmp_path):
    directory = _schema_1_store(tmp_path / "v1", {"bucket-a": json.dumps(TORCH_KEPT).encode()})
    _damage_an_index(directory / DATABASE_NAME, "plans_by_last_use")
    store = PersistentStore(directory)  # a writer meets the damage and salvages into the current schema
    assert store.get_runner_choice(RELEASED_FINGERPRINT, "bucket-a") == TORCH_KEPT
    assert store.info()["plans"] == len(RELEASED["plans"]) and store.integrity_check() == ["ok"]


WRITER = """
import sys
from store_samples import H100
from fusedattn_select.store import PersistentStore
store = PersistentStore(sys.argv[1])
for index in range(int(sys.argv[3])):
    key = f"{sys.argv[2]}-{index}"
    if store.put_runner_choice(H100, key, {"runner": "torch", "torch_us": float(index), "cudnn_us": 1.0}):
        print(key, flush=True)
"""


def test_writers_lose_no_acknowledged_runner_choice_while_another_process_salvages(cache_dir):
    PersistentStore(cache_dir).put_runner_choice(H100, "seed", TORCH_KEPT)
    acknowledged = race_writers_with_salvage(cache_dir, WRITER, salvages=8)
    assert len(acknowledged) == 600  # every write succeeded
    conn = sqlite3.connect(cache_dir / DATABASE_NAME)
    stored = {row[0] for row in conn.execute("SELECT runner_key FROM runner_choices")}
    conn.close()
    assert acknowledged | {"seed"} <= stored


def test_a_runner_choice_written_while_another_process_writes_decisions_is_kept(cache_dir):
    decisions = subprocess.Popen([sys.executable, "-c", """
import sys
from store_samples import H100, SUPPORTED_FULL
from fusedattn_select.store import PersistentStore
from fusedattn_select.types import Fingerprint, ProbeDepth
store = PersistentStore(sys.argv[1])
for index in range(300):
    assert store.put(H100, f"key-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
""", str(cache_dir)], env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path])))
    store = PersistentStore(cache_dir)
    written = [f"bucket-{index}" for index in range(100) if store.put_runner_choice(H100, f"bucket-{index}", TORCH_KEPT)]
    assert decisions.wait(120) == 0 and len(written) == 100
    again = PersistentStore(cache_dir)
    assert all(again.get_runner_choice(H100, key) == TORCH_KEPT for key in written)
    assert again.info()["entries"] == 300
