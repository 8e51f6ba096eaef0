"""fusedattn_select.distributed without a process group (one rank), the work split, and the checks
a received plan must pass. In-process; answers from the bundled H100 snapshot."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from fusedattn_select import distributed  # noqa: E402
from fusedattn_select.config import AttnConfig  # noqa: E402
from fusedattn_select.config_files import load_config_file  # noqa: E402
from fusedattn_select.distributed.facts import RankFacts  # noqa: E402
from fusedattn_select.distributed.sharing import ACCEPTED, PRESENT, PlanRow, receive_plan  # noqa: E402
from fusedattn_select.errors import ConfigError  # noqa: E402
from fusedattn_select.probing.snapshot import SnapshotEngine  # noqa: E402
from fusedattn_select.selection.selector import Selector  # noqa: E402
from fusedattn_select.store import PersistentStore  # noqa: E402
from fusedattn_select.types import ProbeDepth  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "fusedattn_select" / "snapshots" / "h100-configs.json"


def llama() -> list[tuple[str, AttnConfig]]:
    config_file = load_config_file(ROOT / "configs" / "llama-3-8b.yaml")
    return [(e.name, e.config) for e in config_file.entries]


def test_agree_without_a_process_group_answers_locally():
    selector = Selector(SnapshotEngine.load(H100))
    report = distributed.agree(llama(), selector=selector)
    assert report.ranks == (0,) and report.agreed and not report.mixed_platforms
    assert {n: s.backend.value for n, s in report.selections.items()} == {
        n: selector.select(c).backend.value for n, c in llama()}


def test_warmup_without_a_process_group_warms_everything_on_the_one_rank(tmp_path):
    selector = Selector(SnapshotEngine.load(H100), store=PersistentStore(tmp_path / "store"))
    report = distributed.warmup(llama(), depth="full", selector=selector)
    assert len(report.local.rows) == len(report.combined.rows) == len(llama())
    assert report.received.decisions == 0 and report.plan_bytes_sent == 0
    assert set(report.owners.values()) == {0}


def test_a_local_error_propagates_as_it_is_without_a_process_group():
    selector = Selector(SnapshotEngine.load(H100))
    with pytest.raises(ConfigError, match="configs\\[0\\]"):
        distributed.agree(["not a config"], selector=selector)
    with pytest.raises(ConfigError, match="timeout"):
        distributed.agree(llama(), selector=selector, timeout=0)


def test_the_split_is_deterministic_balanced_and_covers_every_problem_once():
    items, duplicates = distributed.work_items(llama() + llama()[:2], ProbeDepth.FULL)
    assert duplicates == 2 and len(items) == len(llama())
    shares = distributed.split(items, [3, 1])
    assert shares == distributed.split(list(reversed(items)), [1, 3])
    assert sorted(i.key for share in shares.values() for i in share) == sorted(i.key for i in items)
    loads = [sum(i.cost for i in share) for share in shares.values()]
    assert max(loads) - min(loads) <= max(i.cost for i in items)
    # Training problems attention() runs cost most: a full probe and a plan build per pass.
    costs = {i.name: i.cost for i in items}
    assert costs["train-bf16"] == 4 and costs["train-bf16-packed-thd"] == 2 and costs["decode-paged"] == 1


def _facts(selector: Selector, rank: int, **changes) -> RankFacts:
    facts = RankFacts.of(rank, "host", selector)
    return RankFacts(**{**facts.__dict__, **changes})


def test_a_received_plan_is_checked_like_cache_import_before_it_is_stored(tmp_path):
    # The blob is an opaque byte string here: what is tested is the transport's checks, not cuDNN.
    selector = Selector(SnapshotEngine.load(H100), store=PersistentStore(tmp_path / "receiver"))
    me, sender = _facts(selector, 0), _facts(selector, 1, store=("other-host", "/db"))
    blob = b"serialized plan" * 100
    row = PlanRow("k" * 64, me.fingerprint_key, len(blob), hashlib.sha256(blob).hexdigest(), blob)

    tampered = PlanRow(row.plan_key, row.fingerprint_key, row.size, row.sha256, b"X" + blob[1:])
    assert receive_plan(selector, tampered, sender, me) == "sha256 of the blob does not match the row"
    truncated = PlanRow(row.plan_key, row.fingerprint_key, row.size, row.sha256, blob[:-1])
    assert "truncated" in receive_plan(selector, truncated, sender, me)
    h200 = _facts(selector, 1, fingerprint={**me.fingerprint, "device_name": "NVIDIA H200"})
    assert "does not hash to its key" in receive_plan(selector, row, h200, me)
    assert receive_plan(selector, row, _facts(selector, 1, source="live_probe"), me).startswith("from another platform")
    assert selector.store.get_plan(selector.fingerprint, row.plan_key) is None

    assert receive_plan(selector, row, sender, me) == ACCEPTED
    assert selector.store.get_plan(selector.fingerprint, row.plan_key) == blob
    assert receive_plan(selector, row, sender, me) == PRESENT
