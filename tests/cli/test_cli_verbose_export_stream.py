"""`cache export -` with -v says its counts on stderr once: the command's own line, not also the store's
log line of the same export (it printed both, one after the other)."""

from __future__ import annotations

import json
import os

from fusedattn_select import cli
from fusedattn_select.store import PersistentStore
from fusedattn_select.types import Backend, Fingerprint, Outcome, Phase, ProbeDepth, Verdict

FINGERPRINT = Fingerprint("cuda", "Test GPU H100", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")
SUPPORTED = (Verdict(Backend.F16, Phase.FORWARD, Outcome.SUPPORTED, "check_support", "", depth=ProbeDepth.FAST),)


def test_verbose_export_to_stdout_says_its_counts_once(capsys, tmp_path, monkeypatch):
    os.chmod(tmp_path, 0o700)
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(tmp_path / "cache"))
    assert PersistentStore(tmp_path / "cache").put(FINGERPRINT, "key-1", SUPPORTED, ProbeDepth.FAST)
    code = cli.main(["-v", "cache", "export", "-"])
    out, err = capsys.readouterr()
    assert code == 0 and len(json.loads(out)["verdicts"]) == 1
    told = [line for line in err.splitlines() if "1 decisions, 0 plans and 0 runner choices" in line]
    assert told == ["cache export: wrote 1 decisions, 0 plans and 0 runner choices to stdout"], err


def test_verbose_export_to_a_file_still_logs_it(capsys, tmp_path, monkeypatch):
    os.chmod(tmp_path, 0o700)
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(tmp_path / "cache"))
    assert PersistentStore(tmp_path / "cache").put(FINGERPRINT, "key-1", SUPPORTED, ProbeDepth.FAST)
    code = cli.main(["-v", "cache", "export", str(tmp_path / "out.json")])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["verdicts"] == 1
    assert err.splitlines() == [f"INFO fusedattn_select: exported 1 decisions, 0 plans and 0 runner choices to "
                                f"{tmp_path / 'out.json'}"]
