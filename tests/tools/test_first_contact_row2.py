"""tools/first_contact row 2 (generate() at first contact): its rounds, the host probes, the paired and
full-speed figures, its verdicts, --models and the merge of models, without a GPU."""

from __future__ import annotations

import argparse
import copy

import pytest

from first_contact_documents import DOCUMENT, run_document as _run_document
from tools.first_contact import options, parts, targets
from tools.first_contact.options import Budget


def test_each_generate_call_is_its_median_over_the_processes(monkeypatch):
    speeds = {"ours": iter([(10.0, 90.0), (30.0, 70.0), (20.0, 80.0), (50.0, 60.0), (40.0, 100.0)]),
              "flash": iter([(9.0, 9.0)] * 99),
              "default": iter([(1.0, 1.0)] * 99)}

    def fake(part, side, args, timeout_s, env=None):
        first, again = next(speeds[side])
        return {"status": "ok", "first_tokens": [1, 2], "calls": {"first": {"prompt": 3, "tokens_per_s": first},
                                                                 "again": {"prompt": 3, "tokens_per_s": again}}}

    monkeypatch.setattr(parts, "run_fresh", fake)
    plan = options.parse_args(["--quick", "--processes", "5"])  # one model
    found = parts.generate(plan, Budget(100.0))["models"]["llama"]["sides"]["ours"]
    assert parts.GENERATE_ROUNDS == 9
    assert found["calls"] == {"first": {"prompt": 3, "tokens_per_s": 30.0}, "again": {"prompt": 3, "tokens_per_s": 80.0}}
    assert [c["first"]["tokens_per_s"] for c in found["rounds_calls"]] == [10.0, 30.0, 20.0, 50.0, 40.0]
    assert found["first_tokens_equal_to_flash"] == 1.0


def test_rounds_alternate_the_order_of_the_sides_and_record_each_round(monkeypatch):
    started = []

    def fake(part, side, args, timeout_s, env=None):
        started.append(side)
        return {"status": "ok"}

    monkeypatch.setattr(parts, "run_fresh", fake)
    runs = parts._rounds("first_calls", {}, Budget(100.0), options.parse_args(["--processes", "3"]))
    assert started == ["ours", "flash", "default", "default", "flash", "ours", "ours", "flash", "default"]
    assert [r["round"] for r in runs["flash"]] == [0, 1, 2]


def test_generate_runs_ours_and_flash_and_pairs_their_rounds(monkeypatch):
    speeds = {"ours": iter([100.0, 50.0, 90.0]), "flash": iter([0.0, 40.0, 200.0])}
    started = []

    def fake(part, side, args, timeout_s, env=None):
        started.append(side)
        speed = next(speeds[side])
        if not speed:
            return {"status": "failed: exit code 1: boom"}
        return {"status": "ok", "calls": {"first": {"tokens_per_s": speed}, "again": {"tokens_per_s": 2 * speed}}}

    monkeypatch.setattr(parts, "run_fresh", fake)
    found = parts.generate(options.parse_args(["--quick", "--processes", "3"]), Budget(100.0))["models"]["llama"]
    assert started == ["ours", "flash", "flash", "ours", "ours", "flash"] and set(found["sides"]) == {"ours", "flash"}
    # Round 0's flash process failed: its ours process is paired with nothing, the others by round.
    assert found["paired_ratios"] == {"first": [1.25, 0.45], "again": [1.25, 0.45]}
    assert found["sides"]["flash"]["rounds_of_calls"] == [1, 2]


def test_row_2_takes_the_median_of_the_paired_ratios_where_the_run_has_them():
    document = copy.deepcopy(DOCUMENT)
    llama = document["parts"]["generate"]["models"]["llama"]
    llama["paired_ratios"] = {"first": [0.8, 1.2, 0.95], "again": [1.0, 1.1, 0.7], "new_prompt": []}
    verdicts = [v for v in targets.evaluate(document) if v.row == 2]
    assert [(round(v.value, 4), v.verdict) for v in verdicts[:2]] == [(0.95, "met"), (1.0, "met")]
    assert verdicts[0].measured == "0.95x (median of 3 rounds' ratios; medians 95.0 vs 100.0 tokens/s)"
    assert verdicts[2].verdict == "n/a: no round where both sides finished"


def _probed(speed, probe):
    return {"status": "ok", "calls": {"again": {"tokens_per_s": speed, "probe_ms": [probe, probe]}}}


def test_steady_host_keeps_the_calls_whose_probes_ran_at_full_speed():
    runs = {"ours": [_probed(100.0, 3.0), _probed(60.0, 6.0), _probed(120.0, 3.5), {"status": "failed: x"}],
            "flash": [_probed(110.0, 3.2), _probed(70.0, 5.9), _probed(90.0, 3.8)]}
    runs["ours"][2]["calls"]["again"]["probe_ms"] = [3.1, 4.0]  # slowed during the call: after-probe 4.0 > 3.9
    found = parts.steady_host(runs)
    assert found["fastest_probe_ms"] == 3.0 and found["limit_ms"] == pytest.approx(3.9)
    assert found["sides"]["ours"]["again"] == {"tokens_per_s": 100.0, "processes": 1, "of": 3}
    assert found["sides"]["flash"]["again"] == {"tokens_per_s": 100.0, "processes": 2, "of": 3}
    assert parts.steady_host({"ours": [{"status": "ok", "calls": {"again": {"tokens_per_s": 1.0}}}]}) == {}


def test_steady_host_counts_the_repeats_of_again_as_again():
    runs = {"ours": [_probed(100.0, 3.0), _probed(60.0, 6.0)], "flash": [_probed(90.0, 3.0)]}
    runs["ours"][0]["calls"]["again 2"] = {"tokens_per_s": 120.0, "probe_ms": [3.0, 3.1]}
    runs["ours"][0]["calls"]["again 3"] = {"tokens_per_s": 10.0, "probe_ms": [3.0, 9.0]}  # slowed: left out
    runs["ours"][1]["calls"]["again 2"] = {"tokens_per_s": 80.0, "probe_ms": [3.5, 3.5]}
    found = parts.steady_host(runs)["sides"]
    # ours: process 1's full-speed repeats 100 and 120 (median 110), process 2's 80 alone.
    assert found["ours"] == {"again": {"tokens_per_s": 95.0, "processes": 2, "of": 2}}
    assert found["flash"] == {"again": {"tokens_per_s": 90.0, "processes": 1, "of": 1}}


def test_the_pairs_take_a_process_s_repeats_and_a_figure_missing_on_either_side_alike():
    def process(round_, **speeds):
        return {"status": "ok", "round": round_, "calls": {name.replace("_", " "): {"tokens_per_s": v}
                                                          for name, v in speeds.items()}}

    runs = {"ours": [process(0, first=10.0, again=100.0, again_2=140.0), process(1, first=None, again=0.0)],
            "flash": [process(0, first=20.0, again=100.0, again_2=100.0), process(1, first=10.0, again=50.0)]}
    assert parts.paired_ratios(runs) == {"first": [0.5], "again": [1.2]}
    runs["ours"][1]["calls"], runs["flash"][1]["calls"] = runs["flash"][1]["calls"], runs["ours"][1]["calls"]
    assert parts.paired_ratios(runs) == {"first": [0.5], "again": [1.2]}


def test_the_steady_figures_read_the_probes_cpu_time_where_recorded():
    # Wall time slow (the thread waited for the GIL), CPU time fast: the host ran at full speed.
    waited = {"status": "ok", "calls": {"again": {"tokens_per_s": 80.0, "probe_ms": [9.0, 9.0],
                                                  "probe_cpu_ms": [3.0, 3.1]}}}
    found = parts.steady_host({"ours": [waited], "flash": [_probed(90.0, 3.0)]})
    assert found["sides"]["ours"]["again"] == {"tokens_per_s": 80.0, "processes": 1, "of": 1}


def test_a_missed_verdict_on_the_full_speed_figures():
    document = copy.deepcopy(DOCUMENT)
    steady = {"tokens_per_s": 90.0, "processes": 4, "of": 5}
    document["parts"]["generate"]["models"]["llama"]["steady"] = {"sides": {
        "ours": {"again": steady}, "flash": {"again": dict(steady, tokens_per_s=100.0)}}}
    again = [v for v in targets.evaluate(document) if v.row == 2][1]
    assert (again.value, again.verdict) == (0.9, "missed")


def test_row_2_compares_the_full_speed_calls_where_the_run_probed_the_host():
    document = copy.deepcopy(DOCUMENT)
    llama = document["parts"]["generate"]["models"]["llama"]
    llama["paired_ratios"] = {"again": [0.8, 0.9, 1.0]}
    steady = {"tokens_per_s": 105.0, "processes": 3, "of": 5}
    llama["steady"] = {"sides": {
        "ours": {"first": steady, "again": dict(steady, tokens_per_s=160.0)},
        "flash": {"first": dict(steady, processes=2), "again": dict(steady, tokens_per_s=150.0)}}}
    first, again, new = [v for v in targets.evaluate(document) if v.row == 2]
    assert first.verdict == ("n/a: fewer than 3 processes per side ran this call at full host speed "
                             "(ours 3 of 5, flash 2 of 5)")  # no paired ratios for this call
    assert (round(again.value, 4), again.verdict) == (round(160 / 150, 4), "met")
    assert again.measured == ("1.07x (160.0 vs 150.0 tokens/s, full host speed: ours 3 of 5, flash 3 of 5; "
                              "every round paired: 0.90x)")
    assert new.verdict.startswith("n/a: fewer than 3") and "ours 0 of 0" in new.verdict
    llama["paired_ratios"]["first"] = [1.1, 0.7, 0.8]
    first = [v for v in targets.evaluate(document) if v.row == 2][0]
    assert first.verdict.endswith("(ours 3 of 5, flash 2 of 5; every round paired: 0.80x)")


def test_a_generate_call_records_the_host_probe_before_and_after_it_on_cpu(monkeypatch):
    from tools.first_contact import models

    monkeypatch.setenv("FIRST_CONTACT_DEVICE", "cpu")
    config = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 64}
    found = models.generate("default", {"config": config, "batch": 1, "prompt": 8, "new_tokens": 2,
                                        "new_prompt": 12, "again_calls": 2, "seed": 0})
    assert list(found["calls"]) == ["first", "again", "again 2", "new_prompt"]
    assert [c["prompt"] for c in found["calls"].values()] == [8, 8, 8, 12]
    for call in found["calls"].values():
        assert len(call["probe_ms"]) == len(call["probe_cpu_ms"]) == 2
        assert all(0 < ms < 1e4 for ms in call["probe_ms"] + call["probe_cpu_ms"])
    long, short = models.host_probe(400_000), models.host_probe(4_000)
    assert long[0] > short[0] and long[1] > short[1] and long[1] <= long[0] * 1.05


def test_generated_tokens_are_compared_with_flash():
    sides = {"ours": {"first_tokens": [1, 2, 3, 4]}, "flash": {"first_tokens": [1, 2, 3, 5]},
             "default": {"status": "failed: x"}}
    parts._token_agreement(sides)
    assert sides["ours"]["first_tokens_equal_to_flash"] == 0.75 and sides["flash"]["first_tokens_equal_to_flash"] == 1
    assert "first_tokens_equal_to_flash" not in sides["default"]


def test_a_run_of_some_models_replaces_only_those_in_a_merge():
    from tools.first_contact import merge

    both = _run_document(("generate",), "aaa")
    both["parts"]["generate"]["models"]["qwen2"] = copy.deepcopy(both["parts"]["generate"]["models"]["llama"])
    llama = _run_document(("generate",), "bbb")
    llama["parts"]["generate"]["models"]["llama"]["sides"]["ours"]["calls"]["again"]["tokens_per_s"] = 50.0
    merged = merge.merge([both, llama])
    models = merged["parts"]["generate"]["models"]
    assert set(models) == {"llama", "qwen2"} and merged["parts"]["generate"]["model_runs"] == {"llama": 1, "qwen2": 0}
    assert models["llama"]["sides"]["ours"]["calls"]["again"]["tokens_per_s"] == 50.0
    assert models["qwen2"]["sides"]["ours"]["calls"]["again"]["tokens_per_s"] == 110.0
    assert len([v for v in merged["targets"] if v["row"] == 2]) == 6
    # Merged again after a third run of Qwen2, each model keeps the run it came from.
    qwen2 = _run_document(("generate",), "ccc")
    qwen2["parts"]["generate"]["models"] = {"qwen2": both["parts"]["generate"]["models"]["qwen2"]}
    again = merge.merge([merged, qwen2])
    assert again["parts"]["generate"]["model_runs"] == {"llama": 1, "qwen2": 2}
    assert [run["git_commit"] for run in again["merged_from"]] == ["aaa", "bbb", "ccc"]
    # A merged document after a run: its own runs move by the runs listed before them.
    after = merge.merge([qwen2, merged])
    assert after["parts"]["generate"]["model_runs"] == {"qwen2": 1, "llama": 2}
    # A later run that measured no model of row 2 leaves it as it was.
    skipped = _run_document(("generate",), "ddd")
    skipped["parts"]["generate"] = {"status": "skipped: time budget"}
    kept = merge.merge([merged, skipped])
    assert kept["parts"]["generate"] == merged["parts"]["generate"] and kept["part_runs"]["generate"] == 1
    # One model of two failed: the merged part says which, as a run's own part does.
    failed = _run_document(("generate",), "eee")
    failed["parts"]["generate"]["models"] = {"qwen2": {"status": "failed: boom"}}
    merged["parts"]["generate"]["models"]["llama"]["status"] = "ok"  # as a run writes it
    assert merge.merge([merged, failed])["parts"]["generate"]["status"].startswith("partial: 1 of 2 not ok; qwen2")


def test_row_2s_models_are_chosen_by_name():
    assert options.parse_args(["--models", "qwen2"]).generate_models == ("qwen2",)
    assert options.parse_args(["--quick", "--models", "QWEN2, llama"]).generate_models == ("llama", "qwen2")
    with pytest.raises(argparse.ArgumentTypeError, match="'gpt2': use one or more of llama, qwen2"):
        options.parse_models("gpt2")
    with pytest.raises(argparse.ArgumentTypeError, match="use one or more of"):
        options.parse_models(" , ")
