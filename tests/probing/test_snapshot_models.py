"""The model suite's snapshots answer `why --hf-config` for every config.json of the corpus that reads
to problems, at why's defaults and at other batch sizes and lengths of those classes (issue 36).

The recordings here use RecordingTestEngine (a test double standing in for a device, tests/conftest.py):
they check that the recipe (probes/hf-models.yaml over bucket ladders, tools/record_snapshots.py)
covers what `why` asks, not what cuDNN answers. The last test asks the bundled snapshots themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusedattn_select import cli
from fusedattn_select.config_files import load_config_file
from fusedattn_select.probing.choice import DEFAULT_TARGET, TARGETS, bundled_engine, bundled_snapshot
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.recorder import Ladder, record_snapshot, write_snapshot
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import ProbeDepth
from tools.gen_model_suite import OUTPUT, corpus_files, corpus_problems

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def found():
    problems, refused = corpus_problems()
    assert refused == [] and len({p.file for p in problems}) == len(corpus_files()) >= 38
    return problems


@pytest.fixture(scope="module")
def models_snapshot(tmp_path_factory):
    """probes/hf-models.yaml recorded as tools/record_snapshots.py records it, by the test double."""
    from tests.conftest import RecordingTestEngine

    data = record_snapshot([OUTPUT], RecordingTestEngine(), ask_torch=False, ladder=Ladder())
    return write_snapshot(data, tmp_path_factory.mktemp("models") / "test-models.json")


def _run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_corpus_problem_answers_at_why_defaults(found, models_snapshot):
    selector = Selector(SnapshotEngine.load(models_snapshot))
    no_data = [f"{p.file.name} {p.entry.name} {p.sets}" for p in found if selector.select(p.entry.config).no_data]
    assert no_data == []


def test_other_batch_sizes_and_lengths_answer_from_their_bucket(found, models_snapshot):
    # Why's --set batch_size / seqlen_q / seqlen_kv on every bucketable problem (T5's relative bias is not).
    selector = Selector(SnapshotEngine.load(models_snapshot))
    asked = 0
    for problem in found:
        cfg = problem.entry.config
        if selector.bucket_for(cfg.replace(batch_size=7)) is None:
            continue
        for batch, length in ((7, 1000), (16, 4000), (3, 77)):  # within the int32 ragged offsets
            # Self-attention walks both lengths; cross-attention (Whisper) the key length: its ladder's kind.
            lengths = {"seqlen_q": length} if cfg.seqlen_q == cfg.seqlen_kv else {}
            shape = cfg.replace(batch_size=batch, seqlen_kv=length, **lengths)
            answer = selector.select(shape)
            assert not answer.no_data and answer.plan_form.startswith("bucket B="), (problem.entry.name, shape)
            asked += 1
    assert asked >= 3 * 90


@pytest.mark.parametrize("name", ["gpt2.json", "meta-llama-3-8b-instruct.json", "gemma-2-9b-it.json",
                                  "deepseek-v3.json", "whisper-small.json"])
def test_why_hf_config_answers_from_the_models_snapshot(capsys, models_snapshot, name):
    path = str(ROOT / "tests" / "data" / "hf_configs" / name)
    code, out, err = _run(capsys, "why", "--snapshot", str(models_snapshot), "--hf-config", path, "--json")
    results = json.loads(out)["results"]
    assert code in (0, 1), err  # 0 fused, 1 not fused (soft-capping); 3 would be no data
    assert results and not any(r["selection"]["no_data"] for r in results)


def test_a_ladder_of_its_own_depth_keeps_each_rung_at_that_depth(tmp_path, suite_file, recording_engine):
    data = record_snapshot([suite_file], recording_engine, depth="full", ask_torch=False,
                           ladder=Ladder(4, 256, depth="fast"))
    assert data["depth"] == "full" and data["ladder"] == {"max_batch": 4, "max_seqlen": 256, "depth": "fast"}
    # (Rules answer before any probe, at depth fast.)
    probed = [v for e in data["entries"] for v in e["verdicts"] if not v["stage"].startswith("rule:")]
    assert {v["depth"] for v in probed} == {"full"}
    assert {v["depth"] for g in data["buckets"] for v in g["verdicts"]} == {"fast"}
    selector = Selector(SnapshotEngine.load(write_snapshot(data, tmp_path / "depths.json")))
    cfg = data["entries"][0]
    from fusedattn_select.config import AttnConfig

    other = AttnConfig.from_dict(cfg["config"]).replace(batch_size=3, seqlen_q=200, seqlen_kv=200)
    assert selector.select(other, ProbeDepth.FAST).selected
    assert selector.select(other, ProbeDepth.FULL).no_data  # a fast rung says nothing about builds


def test_snapshot_record_takes_a_ladder_depth(capsys, monkeypatch, suite_file, tmp_path, recording_engine):
    from fusedattn_select.cli import engines

    monkeypatch.setattr(engines, "live_engine", lambda: (recording_engine, ""))
    out_path = tmp_path / "rec.json"
    code, _, err = _run(capsys, "snapshot", "record", str(suite_file), "-o", str(out_path), "--depth", "full",
                        "--ladder-depth", "fast", "--ladder-max-batch", "2", "--ladder-max-seqlen", "128")
    assert code == 3, err  # written; the suite's out-of-memory entry is recorded as failed
    assert json.loads(out_path.read_text())["ladder"] == {"max_batch": 2, "max_seqlen": 128, "depth": "fast"}


def _no_data_files(found, target: str) -> set[str]:
    """Corpus files (stems) with a problem the bundled snapshots of `target` answer with no data."""
    selector = Selector(bundled_engine(target))
    return {p.file.stem for p in found if selector.select(p.entry.config).no_data}


def _not_recorded(target: str) -> set[str]:
    """Corpus files (stems) with an entry of probes/hf-models.yaml ("<stem>/<layer kind>/<phase>")
    that `target`'s bundled models recording does not hold (a recording made before the corpus grew)."""
    recorded = {e["name"] for e in json.loads(bundled_snapshot(target, "models").read_text())["entries"]}
    return {e.name.split("/")[0] for e in load_config_file(OUTPUT).entries if e.name not in recorded}


def test_the_default_targets_recording_holds_the_whole_model_suite():
    assert _not_recorded(DEFAULT_TARGET) == set()


# Corpus files whose classes a target's bundled recording predates (docs/snapshots.md): the H200's is
# the first run of 2026-11-27, before these three files joined the corpus.
PREDATED = {"h100": set(), "h200": {"falcon-40b", "gemma-3-270m-it", "gemma-3-27b-it"}}


@pytest.mark.parametrize("target", TARGETS)
def test_the_bundled_snapshots_answer_every_corpus_problem_but_the_files_their_recording_predates(found, target):
    assert PREDATED[target] <= _not_recorded(target)
    assert _no_data_files(found, target) == PREDATED[target]
