"""Snapshots recorded over bucket ladders answer every shape of a recorded class from the bucket a GPU
runs it in, labelled with that bucket; exact shapes answer from their own rows; an unrecorded class
still answers no data with the nearest recorded problems (issue 36, item 1, the CPU half).

Recorded with RecordingTestEngine (a test double standing in for a device, tests/conftest.py): it
probes nothing, its verdicts come from rules. Real snapshots are recorded on GPUs.
"""

from __future__ import annotations

import json

import pytest

from fusedattn_select import cli
from fusedattn_select.buckets import Bucket, bucket_form, ladder
from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import SnapshotError
from fusedattn_select.probing.snapshot import SnapshotEngine
from fusedattn_select.selection.recorder import Ladder, record_snapshot, write_snapshot
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Backend, Outcome, Provenance

# The conftest suite's defaults: train-causal's class is these fields at any batch and length.
CLASS = {"num_heads_q": 16, "num_heads_kv": 4, "head_dim_qk": 128, "mask": "causal"}
BUCKET_8_1024 = "bucket B=8 S_q=1024 S_kv=1024 (ragged thd_thd_thd, padding_causal)"
AT_7_1000 = ["--set", "batch_size=7", "--set", "num_heads_q=16", "--set", "num_heads_kv=4", "--set", "seqlen_q=1000",
             "--set", "seqlen_kv=1000", "--set", "head_dim_qk=128", "--set", "mask=causal"]


def shape(batch: int, seqlen: int, **changes) -> AttnConfig:
    return AttnConfig(batch_size=batch, seqlen_q=seqlen, seqlen_kv=seqlen, **{**CLASS, **changes})


@pytest.fixture
def laddered(tmp_path, suite_file, recording_engine):
    """The conftest suite recorded over ladders up to batch 16 and length 2048 (the data and its path)."""
    data = record_snapshot([suite_file], recording_engine, ladder=Ladder(16, 2048), ask_torch=False)
    return data, write_snapshot(data, tmp_path / "ladder-gpu.json")


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_bucket_rows_say_which_entry_and_bucket_they_are_and_hold_no_config(laddered):
    data, _ = laddered
    entries, groups = data["entries"], data["buckets"]
    assert len(entries) == 7 and data["ladder"] == {"max_batch": 16, "max_seqlen": 2048}
    assert groups and all(set(group) == {"entry", "verdicts", "rungs"} for group in groups)
    forms = []
    for group in groups:
        cfg = AttnConfig.from_dict(entries[group["entry"]]["config"])
        assert all(v["timings_ms"] == {} and v["provenance"] == "live_probe" for v in group["verdicts"])
        for batch, seqlen_q, seqlen_kv, *picked in group["rungs"]:
            assert 1 <= len(picked) <= len(cfg.phases) and Bucket(batch, seqlen_q, seqlen_kv) in ladder(cfg, 16, 2048)
            forms.append(bucket_form(cfg, Bucket(batch, seqlen_q, seqlen_kv)).cache_key())
    # Each form once: four self-attention ladders of 5 batches x 6 lengths, and out-of-memory's (S_q 999
    # in bucket 1024, S_kv walking) less the 5 rungs at S_kv 1024 that infer's class recorded already.
    assert len(forms) == len(set(forms)) == 4 * 5 * 6 + 5 * 6 - 5
    # fp8 and pre-scale-bias have no bucket form; train-causal, infer, train, head-dim-512 and out-of-memory do.
    assert {entries[group["entry"]]["name"] for group in groups} == {
        "train-causal", "infer", "head-dim-512", "out-of-memory", "train"}


def test_the_ladder_is_the_live_ladder_every_shape_up_to_the_maxima_lands_in_one_rung():
    rungs = ladder(shape(2, 1024), 16, 2048)
    assert len(rungs) == 5 * 6 and rungs[0] == Bucket(1, 64, 64) and rungs[-1] == Bucket(16, 2048, 2048)
    for batch in (1, 3, 7, 16):
        for seqlen in (1, 63, 65, 1000, 2048):
            assert Bucket.of(batch, seqlen, seqlen) in rungs or seqlen == 1
    decode = ladder(AttnConfig(batch_size=3, num_heads_q=8, num_heads_kv=2, seqlen_q=1, seqlen_kv=700,
                               head_dim_qk=64, is_training=False), 4, 1024)
    assert {b.seqlen_q for b in decode} == {1} and Bucket.of(3, 1, 700) in decode
    assert ladder(shape(2, 1024, qkv_dtype="fp8_e4m3")) == []
    with pytest.raises(ValueError, match="max_batch=0"):
        ladder(shape(2, 1024), 0)
    with pytest.raises(ValueError, match="ladder max_seqlen=-1"):
        Ladder(4, -1)


def test_batch_7_seqlen_1000_answers_from_the_bucket_that_holds_it_labelled(laddered, recording_engine):
    engine = SnapshotEngine.load(laddered[1])
    cfg = shape(7, 1000)
    answer = Selector(engine).select(cfg)
    assert answer.backend is Backend.F16 and not answer.no_data
    assert answer.plan_form == BUCKET_8_1024 and answer.config == cfg and answer.cache_key == cfg.cache_key()
    assert all(v.provenance is Provenance.SNAPSHOT for v in answer.verdicts)
    # The same bucket the live path runs the shape in (a live selector with nothing learned yet).
    assert engine.bucket_for(cfg) == Selector(recording_engine).bucket_for(cfg) == bucket_form(cfg)


def test_a_bucket_form_answers_itself_whatever_was_asked_before_it(laddered):
    # A rung is recorded as its class and sizes; asking the form first must not make it no data (and
    # then the shapes it serves), nor asking a shape first change what the form answers.
    cfg = shape(7, 1000)
    form = bucket_form(cfg)
    engine = SnapshotEngine.load(laddered[1])
    alone = Selector(engine).select(form)
    assert alone.backend is Backend.F16 and not alone.no_data, alone.reason
    form_first = Selector(engine)
    answers = [form_first.select(form), form_first.select(cfg)]
    shape_first = Selector(SnapshotEngine.load(laddered[1]))
    answers += reversed([shape_first.select(cfg), shape_first.select(form)])
    assert [(a.backend, a.no_data, a.plan_form) for a in answers] == [
        (Backend.F16, False, ""), (Backend.F16, False, BUCKET_8_1024)] * 2
    assert len(engine) == len(SnapshotEngine.load(laddered[1])), "answering changed what the engine holds"


def test_an_exactly_recorded_shape_answers_from_its_own_row(laddered):
    answer = Selector(SnapshotEngine.load(laddered[1])).select(shape(2, 1024))
    assert answer.backend is Backend.F16 and answer.plan_form == ""
    assert answer.cache_key == shape(2, 1024).cache_key()


def test_an_unrecorded_class_is_no_data_with_the_nearest_recorded_entries_never_bucket_rows(laddered):
    engine = SnapshotEngine.load(laddered[1])
    cfg = shape(7, 1000, num_heads_q=32)
    answer = Selector(engine).select(cfg)
    assert answer.no_data and answer.backend is Backend.NONE and answer.plan_form == ""
    near = engine.nearest(cfg)
    assert near[0].problem.name == "train-causal" and all(n.problem.config.qkv_layout != "thd_thd_thd" for n in near)


def test_shapes_past_the_ladder_and_classes_without_bucket_forms_stay_no_data(laddered):
    selector = Selector(SnapshotEngine.load(laddered[1]))
    assert selector.select(shape(200, 1000)).no_data  # batch bucket 256: past the recorded ladder
    assert selector.select(shape(7, 1000, qkv_dtype="fp8_e4m3", num_heads_kv=CLASS["num_heads_q"])).no_data  # FP8 runs dense plans


def test_a_bucket_cudnn_rejects_leaves_no_data_never_unsupported(laddered):
    # A GPU runs such a shape with its own dense graphs, which nothing recorded.
    engine = SnapshotEngine.load(laddered[1])
    cfg = shape(7, 1000, head_dim_qk=512, is_training=False, mask="no_mask")
    assert engine.bucket_for(cfg) is not None  # its bucket was recorded, as unsupported
    answer = Selector(engine).select(cfg)
    assert answer.no_data and all(v.outcome is Outcome.NO_DATA for v in answer.verdicts)


def test_a_fast_bucket_yes_asked_at_depth_full_is_no_data(laddered):
    answer = Selector(SnapshotEngine.load(laddered[1])).select(shape(7, 1000), "full")
    assert answer.no_data and not answer.selected


def test_why_labels_the_bucket_in_text_and_json(capsys, laddered):
    code, out, err = run(capsys, "why", "--snapshot", str(laddered[1]), *AT_7_1000)
    assert code == 0, err
    assert "  -> F16" in out
    assert (f"  answered from: snapshot, {BUCKET_8_1024}, recorded on Test GPU H100, cuDNN 9.19.0 on "
            in out) and "(this shape was not recorded; a GPU runs it in that bucket)" in out
    code, out, _ = run(capsys, "why", "--snapshot", str(laddered[1]), *AT_7_1000, "--json")
    result = json.loads(out)["results"][0]
    assert code == 0 and result["selection"]["plan_form"] == BUCKET_8_1024 and result["nearest"] == []
    assert result["answered_from"].startswith(f"snapshot, {BUCKET_8_1024}, recorded on Test GPU H100")


def test_why_on_an_exact_shape_says_its_own_row_in_json_and_adds_no_line(capsys, laddered):
    exact = [a if a not in ("batch_size=7", "seqlen_q=1000", "seqlen_kv=1000") else
             {"batch_size=7": "batch_size=2"}.get(a, a.replace("1000", "1024")) for a in AT_7_1000]
    code, out, _ = run(capsys, "why", "--snapshot", str(laddered[1]), *exact)
    assert code == 0 and "answered from" not in out
    code, out, _ = run(capsys, "why", "--snapshot", str(laddered[1]), *exact, "--json")
    assert json.loads(out)["results"][0]["answered_from"].startswith("snapshot, this shape's own row, recorded on")


def test_snapshot_record_records_ladders_unless_told_not_to(capsys, monkeypatch, suite_file, tmp_path,
                                                            recording_engine):
    from fusedattn_select.cli import engines

    monkeypatch.setattr(engines, "live_engine", lambda: (recording_engine, ""))
    out_path = tmp_path / "rec.json"
    code, out, _ = run(capsys, "snapshot", "record", str(suite_file), "-o", str(out_path),
                       "--ladder-max-batch", "8", "--ladder-max-seqlen", "1024")
    data = json.loads(out_path.read_text())
    rungs = sum(len(group["rungs"]) for group in data["buckets"])
    assert code == 3 and f"(and their classes' ladders: {len(data['buckets'])} groups, {rungs} rungs)" in out
    assert data["ladder"] == {"max_batch": 8, "max_seqlen": 1024} and data["buckets"]
    code, _, _ = run(capsys, "snapshot", "record", str(suite_file), "-o", str(out_path), "--no-ladder")
    assert code == 3 and "buckets" not in json.loads(out_path.read_text())
    code, _, err = run(capsys, "snapshot", "record", str(suite_file), "-o", str(out_path), "--ladder-max-batch", "0")
    assert code == 2 and "must be a positive integer" in err


@pytest.mark.parametrize("change, message", [
    (lambda group: group.update(entry=99), r"buckets\[0\]: entry=99: must be the index of a recorded entry"),
    (lambda group: group.update(entry=True), r"buckets\[0\]: entry=True"),
    (lambda group: group["rungs"][0].__setitem__(0, 0), r"buckets\[0\]: rungs\[0\]=\[0, 64, 64, 0, 1\]: must be"),
    (lambda group: group["rungs"][0].append(1),
     r"buckets\[0\]: rungs\[0\]=\[1, 64, 64, 0, 1, 1\]: must be .* 1 to 2 verdict"),
    (lambda group: group["rungs"][0].__setitem__(3, 7), r"buckets\[0\]: rungs\[0\]: verdict indices \[7, 1\] must be"),
    (lambda group: group.update(rungs={}), r"buckets\[0\]: 'rungs' must be a list"),
    (lambda group: group.update(verdicts=[{"phase": "forward"}]), r"buckets\[0\]: malformed verdicts"),
])
def test_a_malformed_bucket_row_is_an_error_naming_the_row_and_field(laddered, tmp_path, change, message):
    data = json.loads(laddered[1].read_text())
    change(data["buckets"][0])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SnapshotError, match=message):
        SnapshotEngine.load(path)


def test_a_bucket_row_of_an_entry_without_bucket_form_is_refused(laddered, tmp_path):
    data = json.loads(laddered[1].read_text())
    fp8 = next(i for i, e in enumerate(data["entries"]) if e["name"] == "fp8")
    data["buckets"][0]["entry"] = fp8
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SnapshotError, match=r"buckets\[0\]: entries\[5\] \(test-suite.yaml/fp8\) has no bucket form"):
        SnapshotEngine.load(path)


def test_a_snapshot_without_ladders_answers_only_its_exact_shapes(recorded_snapshot):
    engine = SnapshotEngine.load(recorded_snapshot)
    assert engine.bucket_count == 0 and engine.bucket_for(shape(7, 1000)) is None
    assert Selector(engine).select(shape(7, 1000)).no_data
