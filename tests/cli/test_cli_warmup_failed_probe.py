"""A warmup whose probe fails answers as `why` and `matrix` do: a failed probe is no answer (exit 3),
never a refusal (exit 1); a refusal beside it still exits 1.

The engine is RecordingTestEngine (tests/conftest.py), a test double standing in for a live device,
here one whose probe raises for head dim 96 (a broken driver call, say).
"""

import json

import pytest

from recording_engine import RecordingTestEngine
from fusedattn_select.cli.main import main
from fusedattn_select.probing import choice

SUITE = """
name: small
defaults: {batch_size: 2, num_heads_q: 16, num_heads_kv: 4, seqlen_q: 1024, seqlen_kv: 1024, is_training: false}
configs:
  - {name: fine, head_dim_qk: 128}
  - {name: raises, head_dim_qk: 96}
"""


class RaisingEngine(RecordingTestEngine):
    """TEST DOUBLE: the recording engine, whose probe raises for head dim 96."""

    def probe(self, cfg, backend, phase, depth):
        if cfg.head_dim_qk == 96:
            raise RuntimeError("injected: the driver call failed")
        return super().probe(cfg, backend, phase, depth)


@pytest.fixture
def raising_device(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(choice, "SNAPSHOT_DIR", tmp_path / "no-bundled")
    monkeypatch.setattr(choice, "live_engine", lambda: (RaisingEngine(), ""))


def run(capsys, tmp_path, suite: str, *args: str) -> tuple[int, str]:
    path = tmp_path / "suite.yaml"
    path.write_text(suite)
    code = main(["warmup", str(path), "--depth", "fast", *args])
    return code, capsys.readouterr().out


def test_a_warmup_whose_probe_fails_exits_3_not_1(capsys, tmp_path, raising_device):
    code, out = run(capsys, tmp_path, SUITE, "--json")
    rows = {row["name"]: row["outcome"] for row in json.loads(out)["rows"]}
    assert rows == {"small/fine": "accepted", "small/raises": "failed"}
    assert code == 3


def test_a_refusal_beside_a_failed_probe_still_exits_1(capsys, tmp_path, raising_device):
    refused = SUITE + "  - {name: refused, head_dim_qk: 512}\n"
    code, out = run(capsys, tmp_path, refused)
    assert "1 accepted, 1 rejected, 1 failed" in out
    assert code == 1


def test_a_row_is_classed_as_why_and_matrix_class_its_answer():
    from fusedattn_select.result import Selection
    from fusedattn_select.selection.local_warmup import WarmupOutcome, _row
    from fusedattn_select.types import Backend, Outcome, Phase, Verdict

    def verdict(backend, outcome):
        return Verdict(backend, Phase.FORWARD, outcome, "check_support")

    def outcome(backend, *verdicts):
        return _row("p", "k", Selection(backend, "", verdicts=verdicts), 0.0).outcome

    # F16 selected while the FP8 probe ran out of memory: an answer, accepted.
    assert outcome(Backend.F16, verdict(Backend.F16, Outcome.SUPPORTED),
                   verdict(Backend.FP8, Outcome.FAILED)) is WarmupOutcome.ACCEPTED
    # A refusal beside a failed probe: refused. A failed probe alone: failed (no answer).
    assert outcome(Backend.NONE, verdict(Backend.F16, Outcome.UNSUPPORTED),
                   verdict(Backend.FP8, Outcome.FAILED)) is WarmupOutcome.REJECTED
    assert outcome(Backend.NONE, verdict(Backend.F16, Outcome.FAILED)) is WarmupOutcome.FAILED


def test_a_failed_probe_beside_a_refusal_is_neither_shared_nor_probed_again():
    # The row is rejected (the refusal is an answer) but its failed probe was not cached: shared
    # warmup must not ask the selector again (a second live probe) nor send the uncached verdicts.
    from fusedattn_select.config import AttnConfig
    from fusedattn_select.distributed.sharing import outgoing
    from fusedattn_select.distributed.work import WorkItem
    from fusedattn_select.selection.local_warmup import WarmupOutcome, _row
    from fusedattn_select.selection.selector import Selector
    from fusedattn_select.types import Outcome, Phase, ProbeDepth, Verdict

    class ForwardFailsBackwardRefused(RecordingTestEngine):
        """TEST DOUBLE: the forward probe runs out of memory, the backward is refused."""

        def probe(self, cfg, backend, phase, depth):
            self.calls += 1
            outcome = Outcome.FAILED if phase is Phase.FORWARD else Outcome.UNSUPPORTED
            return Verdict(backend, phase, outcome, "build_plans", "out of memory" if phase is Phase.FORWARD
                           else "refused", "", None, depth, ())

    engine = ForwardFailsBackwardRefused()
    selector = Selector(engine)
    cfg = AttnConfig(batch_size=2, num_heads_q=8, num_heads_kv=8, seqlen_q=128, seqlen_kv=128, head_dim_qk=64)
    row = _row("p", cfg.cache_key(), selector.select(cfg, ProbeDepth.FAST), 0.0)
    assert row.outcome is WarmupOutcome.REJECTED and row.probe_failed
    probes = engine.calls
    share = outgoing(selector, [WorkItem(cfg.cache_key(), "p", cfg, 1)], [row], ProbeDepth.FAST, False)
    assert engine.calls == probes and share.decisions == ()
