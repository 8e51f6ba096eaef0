"""A snapshot whose recorded cache_keys this version derives otherwise says so once per file at DEBUG
(how many, which first), not one line per entry on every load."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import fusedattn_select
from fusedattn_select.probing.snapshot import SnapshotEngine

BUNDLED = Path(fusedattn_select.__file__).parent / "snapshots" / "h100-configs.json"


def test_rederived_keys_are_one_debug_line_a_file(tmp_path, caplog):
    data = json.loads(BUNDLED.read_text())
    for entry in data["entries"][:7]:
        entry["cache_key"] = "0" * 16  # recorded by an older derivation
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    with caplog.at_level(logging.DEBUG, logger="fusedattn_select"):
        SnapshotEngine.load(edited)
    said = [r.getMessage() for r in caplog.records if "re-derived" in r.getMessage()]
    assert len(said) == 1, said
    count = int(said[0].split(": ")[1].split(" ")[0])
    assert count >= 7 and "(entries[0], entries[1], entries[2], entries[3], entries[4], ...)" in said[0]
