"""Plans are refused where the write-ahead log SQLite reads is writable by others, also when the
database file is a symbolic link: SQLite resolves the link and keeps its -wal and -shm beside the
file the link leads to, not beside the link."""

import os

from fusedattn_select.store import PersistentStore
from store_samples import H100


def _linked_store(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    os.chmod(elsewhere, 0o755)  # (whatever the umask) others may enter it, not write it
    real = elsewhere / "decisions.sqlite3"
    os.close(os.open(real, os.O_WRONLY | os.O_CREAT, 0o600))
    os.symlink(real, cache / "decisions.sqlite3")
    store = PersistentStore(cache)
    assert store.put_plan(H100, "plan-1", b"plan bytes" * 10)  # open: its -wal and -shm stay
    return store, real


def test_a_log_writable_by_others_beside_a_linked_database_refuses_plans(tmp_path):
    store, real = _linked_store(tmp_path)
    log_file = real.with_name(real.name + "-wal")
    assert log_file.exists() and not (store.directory / "decisions.sqlite3-wal").exists()
    os.chmod(log_file, 0o666)
    assert store.plans_enabled is False
    assert store.info()["plans_refused"] == f"{log_file} is writable by group or others (mode 666)"
    assert store.get_plan(H100, "plan-1") is None


def test_a_linked_database_with_private_files_keeps_plans(tmp_path):
    store, _ = _linked_store(tmp_path)
    assert store.plans_enabled and store.get_plan(H100, "plan-1") == b"plan bytes" * 10
