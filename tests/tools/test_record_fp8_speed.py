"""tools/record_fp8_speed.py says in its exit status when it could not record, and writes nothing."""

from __future__ import annotations

import importlib.util

import pytest

from tools import record_fp8_speed


@pytest.mark.skipif(importlib.util.find_spec("cudnn") is not None, reason="cudnn-frontend is installed here")
def test_without_cudnn_it_exits_1_names_the_cause_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "record.json"
    assert record_fp8_speed.main(["-o", str(out)]) == 1
    assert "not recorded" in capsys.readouterr().err
    assert not out.exists()
