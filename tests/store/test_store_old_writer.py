"""A schema 1 writer (the code before runner choices had their own table) connected to a store that a
newer process upgrades, and reads of a schema 1 file that a writer upgrades meanwhile."""

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from store_samples import H100, SUPPORTED_FULL
from test_store_runner_choices import RELEASED_FINGERPRINT, TORCH_KEPT, _schema_1_store

from fusedattn_select.store import PersistentStore, schema, sqlite_rows

REPO = Path(__file__).resolve().parents[2]
SCHEMA_1_COMMIT = "37cdae0^"  # the last code that kept runner choices as `runner:` plan rows
OLD_CHOICE = {"runner": "torch", "torch_us": 1.0, "cudnn_us": 2.0}
NEW_CHOICE = {"runner": "cudnn", "torch_us": 3.0, "cudnn_us": 1.0}

# Run with the schema 1 code first on sys.path: opens the store (schema 1 then), writes runner:k1,
# and for each line it reads writes `runner:<line>` with the choice given after it.
_OLD_WRITER = """
import json, sys
from fusedattn_select.store import PersistentStore
from fusedattn_select.store.protocol import SCHEMA_VERSION
from fusedattn_select.types import Fingerprint
assert SCHEMA_VERSION == 1, SCHEMA_VERSION
fingerprint = Fingerprint.from_dict(json.loads(sys.argv[2]))
store = PersistentStore(sys.argv[1])
print(store.put_plan(fingerprint, "runner:k1", sys.argv[3].encode()), flush=True)
for line in sys.stdin:
    key, choice = line.split(" ", 1)
    print(store.put_plan(fingerprint, "runner:" + key, choice.strip().encode()), flush=True)
"""


@pytest.fixture(scope="module")
def schema_1_code(tmp_path_factory):
    """The package as it was before schema 2 (git archive), or skip where the history is not here."""
    where = tmp_path_factory.mktemp("schema1")
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", SCHEMA_1_COMMIT, "fusedattn_select"],
                                 capture_output=True, check=True, timeout=60).stdout
        subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        pytest.skip(f"no git history with {SCHEMA_1_COMMIT} here")
    return where


class _OldWriter:
    def __init__(self, code: Path, directory: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _OLD_WRITER, str(directory), json.dumps(H100.to_dict()), json.dumps(OLD_CHOICE)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=code, env={"PYTHONPATH": str(code)})
        assert self.read() == "True"

    def read(self) -> str:
        return self.process.stdout.readline().strip()

    def put(self, key: str, choice: dict) -> bool:
        self.process.stdin.write(f"{key} {json.dumps(choice)}\n")
        self.process.stdin.flush()
        return self.read() == "True"

    def close(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0


def _payload_is_consistent(store: PersistentStore) -> bool:
    conn = sqlite3.connect(store.path)
    try:
        total = conn.execute("SELECT bytes FROM totals").fetchone()[0]
        return total == sum(conn.execute(f"SELECT COALESCE(SUM(size), 0) FROM {table}").fetchone()[0]
                            for table in schema.PAYLOAD_TABLES)
    finally:
        conn.close()


def _plan_keys(store: PersistentStore) -> list[str]:
    conn = sqlite3.connect(store.path)
    try:
        return [row[0] for row in conn.execute("SELECT plan_key FROM plans")]
    finally:
        conn.close()


def test_a_schema_1_writer_connected_before_the_upgrade_stores_choices_that_are_read_and_moved(
        schema_1_code, cache_dir, tmp_path):
    old = _OldWriter(schema_1_code, cache_dir)
    new = PersistentStore(cache_dir)
    assert new.put(H100, "decision", SUPPORTED_FULL, "full")  # the writer's open upgrades the file
    assert new.get_runner_choice(H100, "k1") == OLD_CHOICE
    assert old.put("k2", OLD_CHOICE)  # after the upgrade, through the connection it opened before
    old.close()

    assert new.get_runner_choice(H100, "k2") == OLD_CHOICE
    info = new.info()
    assert (info["plans"], info["runner_choices"]) == (0, 2)
    new.export(tmp_path / "export.json")
    document = json.loads((tmp_path / "export.json").read_text())
    assert document["plans"] == []
    assert sorted(row["key"] for row in document["runner_choices"]) == ["k1", "k2"]

    assert _plan_keys(new) == ["runner:k2"]  # not moved yet: this process's writer opened before
    later = PersistentStore(cache_dir)
    assert later.put(H100, "another", SUPPORTED_FULL, "full")  # a writer opening the file moves it
    assert _plan_keys(later) == []
    assert later.get_runner_choice(H100, "k2") == OLD_CHOICE
    assert later.info()["runner_choices"] == 2
    assert _payload_is_consistent(later)


def test_the_newer_of_a_schema_1_writer_choice_and_a_new_one_wins(schema_1_code, cache_dir):
    old = _OldWriter(schema_1_code, cache_dir)
    new = PersistentStore(cache_dir)
    assert new.put_runner_choice(H100, "k1", NEW_CHOICE)  # newer than the old writer's k1: replaces it
    assert new.get_runner_choice(H100, "k1") == NEW_CHOICE
    assert new.put_runner_choice(H100, "k2", NEW_CHOICE)
    assert old.put("k2", OLD_CHOICE)  # measured again by the old writer: now the newest
    old.close()
    assert new.get_runner_choice(H100, "k2") == OLD_CHOICE
    assert new.info()["runner_choices"] == 2
    later = PersistentStore(cache_dir)
    assert later.put(H100, "decision", SUPPORTED_FULL, "full")
    assert _plan_keys(later) == []
    assert (later.get_runner_choice(H100, "k1"), later.get_runner_choice(H100, "k2")) == (NEW_CHOICE, OLD_CHOICE)
    assert _payload_is_consistent(later)


# ----- one snapshot per read ---------------------------------------------------------------------
def _upgrade_after_first_schema_look(monkeypatch, directory: Path) -> None:
    """The first time a read asks whether the file has runner_choices, a writer upgrades it right
    after the answer: the rest of that read must still see the file as it was asked about."""
    real = sqlite_rows.has_table
    done = []

    def has_table(conn, table):
        answer = real(conn, table)
        if not done:
            done.append(True)
            assert PersistentStore(directory).put(H100, "upgrading", SUPPORTED_FULL, "full")
        return answer

    monkeypatch.setattr(sqlite_rows, "has_table", has_table)


def test_a_read_only_lookup_of_a_schema_1_choice_is_one_snapshot(tmp_path, monkeypatch):
    directory = _schema_1_store(tmp_path / "v1", {"bucket-a": json.dumps(TORCH_KEPT).encode()})
    looking = PersistentStore(directory, read_only=True)
    _upgrade_after_first_schema_look(monkeypatch, directory)
    assert looking.get_runner_choice(RELEASED_FINGERPRINT, "bucket-a") == TORCH_KEPT


def test_read_only_totals_of_a_schema_1_file_are_one_snapshot(tmp_path, monkeypatch):
    directory = _schema_1_store(tmp_path / "v1", {"bucket-a": json.dumps(TORCH_KEPT).encode(),
                                                  "bucket-b": json.dumps(TORCH_KEPT).encode()})
    looking = PersistentStore(directory, read_only=True)
    fields = ("entries", "plans", "runner_choices", "bytes")
    info = looking.info()
    before = {field: info[field] for field in fields}
    assert before["runner_choices"] == 2
    _upgrade_after_first_schema_look(monkeypatch, directory)  # it writes a decision too
    info = looking.info()
    assert {field: info[field] for field in fields} == before


def test_a_read_only_export_of_a_schema_1_file_is_one_snapshot(tmp_path, monkeypatch):
    directory = _schema_1_store(tmp_path / "v1", {"bucket-a": json.dumps(TORCH_KEPT).encode()})
    looking = PersistentStore(directory, read_only=True)
    _upgrade_after_first_schema_look(monkeypatch, directory)
    looking.export(tmp_path / "export.json")
    document = json.loads((tmp_path / "export.json").read_text())
    assert [row["key"] for row in document["runner_choices"]] == ["bucket-a"]
