"""probing.choice.live_engine where cudnn-frontend is absent, broken, or fails to load: an answer with
the reason, never an exception, and (where it is absent) without importing the live engine's modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fusedattn_select.probing import choice

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_cudnn(tmp_path, monkeypatch):
    """A `cudnn` module whose import runs `body`, found first on sys.path."""
    def make(body: str) -> None:
        (tmp_path / "cudnn.py").write_text(body)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "cudnn", raising=False)
    return make


def test_a_frontend_that_raises_on_import_is_answered_as_an_engine_that_failed_to_start(fake_cudnn):
    fake_cudnn("raise RuntimeError('broken build')\n")
    engine, why = choice.live_engine()
    assert engine is None and why == "the cuDNN engine failed to start: RuntimeError: broken build"


def test_a_frontend_whose_libraries_do_not_load_says_so(fake_cudnn):
    fake_cudnn("raise OSError('libcudnn.so.9: cannot open shared object file')\n")
    engine, why = choice.live_engine()
    assert engine is None
    assert why == "cudnn-frontend cannot load its libraries (libcudnn.so.9: cannot open shared object file)"


def test_without_the_frontend_the_live_engine_modules_are_not_imported():
    code = ("import sys\nsys.modules['cudnn'] = None  # import cudnn raises ImportError\n"
            "from fusedattn_select.probing import choice\nengine, why = choice.live_engine()\n"
            "print(engine, '|', why, '|', 'fusedattn_select.probing.cudnn.cudnn_engine' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True, text=True, timeout=120)
    engine, why, imported = (part.strip() for part in out.stdout.strip().splitlines()[-1].split("|"))
    assert engine == "None" and imported == "False"
    assert why.startswith("cudnn-frontend is not installed (") and "install 'fusedattn-select[cuda]'" in why
