"""The backend registry is a real seam: a backend added in a module of its own, with one register()
line, answers select() and shows in the `why` table. The toy backend below is a TEST DOUBLE: its
"probe" reads a table, it probes nothing."""

from __future__ import annotations

import importlib.util
import json
import textwrap

import pytest

from fusedattn_select import AttnConfig, backends, cli
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Backend, Phase

# The whole of a new backend: its module (written to a temporary directory, imported from there).
TOY_MODULE = '''
"""TOY: a TEST DOUBLE backend. It answers from a table (head dims it "supports"); it probes nothing."""
from fusedattn_select.backends import BackendEntry
from fusedattn_select.types import Backend, Outcome, Phase, Verdict, declare_backend

TOY = declare_backend("TOY")
TABLE = {64: Outcome.SUPPORTED, 128: Outcome.SUPPORTED}  # head_dim_qk -> answer; anything else: unsupported

def answer_from_table(engine, cfg, backend, phase, depth):
    outcome = TABLE.get(cfg.head_dim_qk, Outcome.UNSUPPORTED)
    message = "" if outcome is Outcome.SUPPORTED else f"head_dim_qk={cfg.head_dim_qk} is not in the toy table"
    return Verdict(backend, phase, outcome, "toy_table", message, depth=depth)

ENTRY = BackendEntry(TOY, dtypes=("bf16",), phases=(Phase.FORWARD,), probe=answer_from_table)
'''
PROBLEM = dict(batch_size=2, num_heads_q=16, num_heads_kv=4, seqlen_q=1024, seqlen_kv=1024, head_dim_qk=128,
               qkv_dtype="bf16", is_training=False)

@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "toy_backend.py"
    path.write_text(textwrap.dedent(TOY_MODULE))
    spec = importlib.util.spec_from_file_location("toy_backend", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    backends.register(module.ENTRY, before=Backend.F16)  # the one registry line
    yield module
    backends.unregister(module.TOY)

def test_a_registered_backend_answers_the_problems_it_declares(toy):
    selection = Selector(engine=_Unused()).select(AttnConfig(**PROBLEM))
    assert selection.backend is toy.TOY and selection.candidate is toy.TOY
    assert [(v.backend, v.phase, v.stage) for v in selection.verdicts] == [(toy.TOY, Phase.FORWARD, "toy_table")]

def test_its_rejection_is_a_verdict_with_its_reason(toy):
    selection = Selector(engine=_Unused()).select(AttnConfig(**dict(PROBLEM, head_dim_qk=96)))
    assert selection.backend is Backend.NONE
    assert selection.message == "TOY forward not supported at toy_table: head_dim_qk=96 is not in the toy table"

def test_problems_it_does_not_declare_keep_their_builtin_backend(toy):
    assert AttnConfig(**dict(PROBLEM, is_training=True)).candidate is Backend.F16  # backward: not declared
    assert AttnConfig(**dict(PROBLEM, qkv_dtype="fp16")).candidate is Backend.F16
    assert AttnConfig(**PROBLEM).candidate is toy.TOY

def test_unregistering_restores_the_builtin_priority(toy):
    backends.unregister(toy.TOY)
    assert [e.backend for e in backends.priority()] == [Backend.F16, Backend.FP8]
    assert AttnConfig(**PROBLEM).candidate is Backend.F16

def test_the_why_table_shows_the_registered_backend(toy, capsys):
    argv = ["why", "--target", "h100"] + [a for k, v in PROBLEM.items() for a in ("--set", f"{k}={v}")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "toy_table" in out and "-> TOY" in out
    assert cli.main([*argv, "--json"]) == 0
    selection = json.loads(capsys.readouterr().out)["results"][0]["selection"]
    assert selection["backend"] == "TOY" and selection["verdicts"][0]["stage"] == "toy_table"

class _Unused:
    """TEST DOUBLE engine: the toy backend probes by itself, so any call here is a failure."""

    name = "unused-test-engine"
    provenance = None

    def fingerprint(self):
        from fusedattn_select.types import Fingerprint
        return Fingerprint("test-double")

    def probe(self, cfg, backend, phase, depth):
        raise AssertionError(f"the engine was asked about {backend}: the registry's probe should answer")
