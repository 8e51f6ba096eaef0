"""A store opened while another process salvages: the opening and the salvage's swap never overlap.

SQLite opens a database file's -wal and -shm by name after the file itself. A salvage that moved
them in between would pair the old file with the new file's log; here the old file's own pages do
not hold the schema yet (it is still in its log), so the opening writes the schema into the new
file's log, which then hides every row of the new file. The hook forces that moment: the swap is
tried right after the opening's sqlite3.connect.
"""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from store_samples import H100, SUPPORTED_FULL

from fusedattn_select.store import DATABASE_NAME, PersistentStore
from fusedattn_select.types import ProbeDepth

ROWS = 20

# Holds a store whose rows are still in its write-ahead log (no checkpoint while it is open).
HOLDER = """
import sys
from store_samples import H100, SUPPORTED_FULL
from fusedattn_select.store import PersistentStore
from fusedattn_select.types import ProbeDepth
store = PersistentStore(sys.argv[1])
for index in range(int(sys.argv[2])):
    assert store.put(H100, f"held-{index}", SUPPORTED_FULL, ProbeDepth.FULL)
print("ready", flush=True)
sys.stdin.readline()
"""

# The swap a damaged file gets, forced on a sound one: at once if the directory's flock is free
# ("swapped at once"), else after waiting for it ("waiting", then "swapped").
SWAP_ONCE = """
import sys, time
from pathlib import Path
from fusedattn_select.store import database, locks
db = database.Database(Path(sys.argv[1]) / "decisions.sqlite3")
with locks.flock_directory(db.path.parent, time.monotonic()) as held:
    if held:
        db._swap.make("forced by the test")
        print("swapped at once", flush=True)
if not held:
    print("waiting", flush=True)
    with db._exclusive():
        db._swap.make("forced by the test")
    print("swapped", flush=True)
"""


def _python(script, *args, **popen):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE,
                            text=True, env=env, **popen)


def test_a_store_opened_while_another_process_swaps_the_file_loses_no_row(cache_dir, monkeypatch):
    holder = _python(HOLDER, cache_dir, ROWS, stdin=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "ready"
        path = str(cache_dir / DATABASE_NAME)
        real_connect = sqlite3.connect
        swapper = []

        def connect_then_swap(target, *args, **kwargs):
            conn = real_connect(target, *args, **kwargs)
            if target == path and not swapper:
                swapper.append(_python(SWAP_ONCE, cache_dir))
                swapper.append(swapper[0].stdout.readline().strip())
            return conn

        monkeypatch.setattr(sqlite3, "connect", connect_then_swap)
        store = PersistentStore(cache_dir)
        monkeypatch.setattr(sqlite3, "connect", real_connect)
        said = swapper[1] + swapper[0].communicate(timeout=60)[0]
        assert "swapped" in said and swapper[0].returncode == 0
        assert store.put(H100, "after", SUPPORTED_FULL, ProbeDepth.FULL)
    finally:
        holder.communicate("\n", timeout=60)
    conn = sqlite3.connect(cache_dir / DATABASE_NAME)
    try:
        keys = {row[0] for row in conn.execute("SELECT config_key FROM verdicts")}
    finally:
        conn.close()
    assert keys == {f"held-{index}" for index in range(ROWS)} | {"after"}
    assert len(list(cache_dir.glob(DATABASE_NAME + ".corrupt-*[0-9]"))) == 1
    assert swapper[1] == "waiting"  # the opening held the directory's flock until it had ended
