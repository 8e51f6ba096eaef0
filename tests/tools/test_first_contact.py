"""tools/bench_first_contact and tools/first_contact: the parts that run without a GPU (arguments, the
time budget, the done-when verdicts and their table, the worker protocol) and one worker run on CPU."""

from __future__ import annotations

import argparse
import ast
import copy
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import tools.first_contact
from tools.first_contact import native_turns, options, parts, processes, targets, worker
from torch_abilities import need_cpu_flash_with_grouped_kv
from tools.first_contact.options import Budget

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(m.name for m in pkgutil.iter_modules(tools.first_contact.__path__))
SOURCES = [ROOT / "tools" / "first_contact" / f"{m}.py" for m in MODULES] + [ROOT / "tools" / "bench_first_contact.py"]


# ----- arguments and budget --------------------------------------------------------------------------
def test_parts_are_chosen_by_row_or_name_in_run_order():
    assert options.parse_parts("all") == tuple(options.PARTS)
    assert options.parse_parts("7,2") == ("generate", "native")
    assert options.parse_parts("4") == ("first_calls",)  # rows 1 and 4 share a process
    assert options.parse_parts("1, 4,big_shape") == ("first_calls", "big_shape")


@pytest.mark.parametrize("text", ["8", "0", "generation", " , "])
def test_unknown_or_empty_parts_are_refused(text):
    with pytest.raises(Exception, match="part"):
        options.parse_parts(text)


def test_every_row_of_issue_34_belongs_to_one_part():
    assert options.ROWS == (1, 2, 3, 4, 5, 6, 7)


def test_full_and_quick_plans():
    full = options.parse_args(["-o", "x.json"])
    assert (full.output, full.budget_s, full.generate_models) == ("x.json", options.FULL_BUDGET_S, ("llama", "qwen2"))
    quick = options.parse_args(["--quick", "--parts", "2,3"])
    assert quick.parts == ("generate", "finetune") and quick.budget_s == options.QUICK_BUDGET_S
    assert quick.generate_models == ("llama",) and quick.finetune_steps < full.finetune_steps
    assert options.parse_args(["--budget", "90"]).budget_s == 90.0
    assert options.FULL_BUDGET_S <= 480  # the whole run stays under 8 minutes


@pytest.mark.parametrize("argv", [["--budget", "0"], ["--budget", "soon"], ["--parts", "9"], ["--frobnicate"]])
def test_bad_arguments_exit_with_a_message(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        options.parse_args(argv)
    assert exited.value.code == 2
    assert "error" in capsys.readouterr().err


def test_budget_gives_what_is_left_and_nothing_below_the_floor():
    now = [100.0]
    budget = Budget(60.0, clock=lambda: now[0])
    assert budget.timeout(90.0) == 60.0
    assert budget.timeout(30.0) == 30.0
    now[0] = 152.0  # 8 s left
    assert budget.timeout(30.0) is None
    assert budget.timeout(30.0, least=5.0) == pytest.approx(8.0)


def test_part_arguments_are_json_and_follow_the_mode():
    import json

    quick, full = options.parse_args(["--quick"]), options.parse_args([])
    for plan in (quick, full):
        for part in ("first_calls", "finetune", "big_shape", "first_step"):
            json.dumps(plan.part_args(part))
    assert quick.part_args("finetune")["steps"] == 5 and full.part_args("finetune")["steps"] == 8
    assert full.part_args("big_shape")["shape"] == (1, 8192, 32, 8, 128)


# ----- verdicts and table --------------------------------------------------------------------------
def _side(**figures):
    return {"status": "ok", **figures}


def _steps(*ms):
    return [{"shape": "s", "call": c, "ms": x} for c, x in zip(("first", "again", "first", "again"), ms)]


def _calls(first, again, new):
    return {name: {"tokens_per_s": v} for name, v in (("first", first), ("again", again), ("new_prompt", new))}


def _tiny(first, early, late):
    return {"first": first, "calls_2_101_median": early, "calls_1001_1100_median": late}


DOCUMENT = {"parts": {
    "first_calls": {"status": "ok", "sides": {
        "ours": _side(steps=_steps(140.0, 1.0, 3.0, 1.0), tiny_us=_tiny(100.0, 20.0, 20.0)),
        "flash": _side(steps=_steps(100.0, 1.0, 1.0, 1.0), tiny_us=_tiny(90.0, 19.0, 19.0)),
        "default": _side(steps=_steps(120.0, 1.0, 2.0, 1.0), tiny_us=_tiny(100.0, 20.0, 16.0))}},
    "generate": {"models": {"llama": {"sides": {
        "ours": _side(calls=_calls(95.0, 110.0, 80.0)), "flash": _side(calls=_calls(100.0, 100.0, 100.0)),
        "default": _side(calls=_calls(50.0, 90.0, 40.0))}}}},
    "finetune": {"sides": {"ours": _side(step_ms=[110.0, 100.0, 90.0]), "flash": _side(step_ms=[100.0, 100.0, 100.0]),
                           "default": _side(step_ms=[300.0, 100.0, 100.0])}},
    "big_shape": {"status": "ok", "impls": {"ours": _side(ms={"median": 4.0}), "raw": _side(ms={"median": 3.8}),
                                            "flash": _side(ms={"median": 6.0})}},
    "first_step": {"sides": {"ours": _side(to_first_result_ms=5000.0), "flash": _side(to_first_result_ms=4000.0),
                             "default": _side(to_first_result_ms=5500.0)}},
    "native": {"status": "ok", "settings": {
        "on": {"generate_tokens_per_s": [110.0, 105.0, 108.0], "train_step_ms": [99.0, 100.0, 101.0],
               "fp8_forward_ms": [80.0, 82.0, 81.0]},
        "off": {"generate_tokens_per_s": [100.0, 100.0, 100.0], "train_step_ms": [100.0, 100.0, 100.0],
                "fp8_forward_ms": [90.0, 90.0, 90.0]}}},
}}


def _by_target(verdicts):
    return {(v.row, v.target.split(" ")[0], i): v for i, v in enumerate(verdicts)}


def test_every_target_gets_its_figure_and_verdict():
    verdicts = targets.evaluate(DOCUMENT)
    got = [(v.row, round(v.value, 4), v.verdict) for v in verdicts]
    assert got == [
        (1, 1.4, "met"), (1, 3.0, "missed"),  # 140/100 ms; 3/1 ms
        (2, 0.95, "met"), (2, 1.1, "met"), (2, 0.8, "missed"),  # tokens/s vs flash: 0.9, 1.0, 0.9
        (3, 1.1, "met"), (3, 1.0, "met"),  # worst step 110/100; total 300/300
        (4, 1.0, "met"), (4, 1.0, "met"), (4, 1.25, "missed"),  # vs SDPA default, not flash
        (5, 0.95, "missed"),  # speed vs raw: 3.8 / 4.0
        (6, round(5000 / 5500, 4), "met"),
        (7, 0.08, "met"), (7, 0.0, "missed"), (7, round(90 / 81 - 1, 4), "met"),  # 108/100 - 1; 100/100 - 1
    ]


def test_a_failed_side_gives_not_measured_never_met():
    document = copy.deepcopy(DOCUMENT)
    document["parts"]["first_calls"]["sides"]["flash"] = {"status": "failed: exit code 1: boom"}
    document["parts"]["finetune"]["sides"]["flash"]["step_ms"] = [100.0, 100.0]  # one step short
    verdicts = [v for v in targets.evaluate(document) if v.row in (1, 3, 4)]
    row1 = [v for v in verdicts if v.row == 1]
    assert all(v.verdict == "n/a: flash: failed: exit code 1: boom" and v.value is None for v in row1)
    assert all(v.verdict.startswith("n/a: steps measured: ours 3, flash 2") for v in verdicts if v.row == 3)
    assert all(v.verdict in ("met", "missed") for v in verdicts if v.row == 4)  # row 4 compares with default


def test_a_skipped_part_and_missing_samples_are_not_measured():
    document = {"parts": {"native": {"status": "skipped: not built (no CUDA toolkit found)"},
                          "big_shape": {"status": "ok", "impls": {"ours": _side(ms={"median": 4.0}),
                                                                  "raw": {"status": "failed: no plan"}}}}}
    verdicts = targets.evaluate(document)
    assert [v.row for v in verdicts] == [5, 7, 7, 7]
    assert verdicts[0].verdict == "n/a: raw: failed: no plan"
    assert verdicts[1].verdict == "n/a: the part: skipped: not built (no CUDA toolkit found)"


def test_a_document_cut_short_gives_not_measured():
    document = copy.deepcopy(DOCUMENT)
    document["parts"]["first_calls"]["sides"]["ours"]["steps"] = _steps(140.0, 1.0)  # the second shape is missing
    del document["parts"]["generate"]["models"]["llama"]["sides"]["flash"]["calls"]["again"]
    verdicts = targets.evaluate(document)
    incomplete = "n/a: figures incomplete (IndexError: list index out of range)"
    assert [v.verdict for v in verdicts if v.row == 1] == ["met", incomplete]
    assert [v.verdict for v in verdicts if v.row == 2][1] == "n/a: figures incomplete (KeyError: 'again')"


def test_only_the_parts_that_ran_have_targets():
    document = {"parts": {"first_step": DOCUMENT["parts"]["first_step"]}}
    assert [v.row for v in targets.evaluate(document)] == [6]
    assert targets.evaluate({}) == []


def test_table_lists_each_target_and_counts():
    text = targets.render(targets.evaluate(DOCUMENT), "Heading")
    lines = text.splitlines()
    assert lines[0] == "Heading" and lines[2] == "| row | done when | measured | verdict |"
    assert "| 5 | b1 s8192 h32/8 d128 causal fwd+bwd, warm: speed >= 0.98x raw cuDNN graph | " \
           "0.95x (raw 3.800 ms / ours 4.000 ms) | missed |" in lines
    assert "| 7 | compiled module: generate() tokens/s gain >= 5% | +8.0% (median 108.0 loaded vs 100.0 not, " \
           "3+3 samples) | met |" in lines
    assert lines[-1] == "10 of 15 targets met; 0 not measured."


def test_table_cells_cannot_break_the_table():
    verdict = targets.Verdict(1, "a | b", None, "n/a", "n/a: line one\nline two")
    assert "| 1 | a \\| b | n/a | n/a: line one line two |" in targets.render([verdict])


# ----- processes and parts ---------------------------------------------------------------------------
def test_answers_are_marker_lines_only():
    assert processes.answer(processes.MARKER + '{"a": 1}') == {"a": 1}
    assert processes.answer('{"a": 1}') is None
    assert processes.answer(processes.MARKER + "[1]") is None


def test_emit_writes_one_clean_marker_line(capsys):
    processes.emit({"x": float("nan"), "shape": (1, 2)})
    assert processes.answer(capsys.readouterr().out.strip()) == {"x": None, "shape": [1, 2]}


def test_a_spent_budget_starts_no_process():
    assert processes.run_fresh("first_step", "ours", {}, None) == {"status": "skipped: time budget"}


def test_unknown_worker_part_is_refused():
    with pytest.raises(ValueError, match="part='nope'"):
        worker.part_function("nope")
    assert set(worker.PART_FUNCTIONS) >= set(options.PARTS) - {"native"} | {"native_serve", "env"}


def test_overall_status_names_the_first_side_that_is_not_ok():
    assert parts.overall_status({"a": {"status": "ok"}, "b": {"status": "ok"}}) == "ok"
    assert parts.overall_status({"a": {"status": "ok"}, "b": {"status": "failed: x"}}) == \
        "partial: 1 of 2 not ok; b: failed: x"
    assert parts.overall_status({"a": {"status": "skipped: time budget"}}).startswith("skipped: 1 of 1")


def test_first_step_is_timed_from_the_process_start(monkeypatch):
    answers = {"ours": 1000.25, "flash": 1000.5, "default": 1001.0}

    def fake(part, side, args, timeout_s, env=None):
        return {"status": "ok", "spawned_at": 1000.0, "first_result_at": answers[side]}

    monkeypatch.setattr(parts, "run_fresh", fake)
    found = parts.first_step(options.parse_args([]), Budget(100.0))
    assert {s: found["sides"][s]["to_first_result_ms"] for s in answers} == {
        "ours": 250.0, "flash": 500.0, "default": 1000.0}
    assert found["status"] == "ok"


def test_each_side_of_the_first_step_is_its_median_process(monkeypatch):
    rounds = {"ours": iter([3000.0, 1000.0, 2000.0]), "flash": iter([1500.0, 1500.0, 1500.0]),
              "default": iter([900.0, 5000.0, 1100.0])}

    def fake(part, side, args, timeout_s, env=None):
        return {"status": "ok", "spawned_at": 0.0, "first_result_at": next(rounds[side]) / 1e3}

    monkeypatch.setattr(parts, "run_fresh", fake)
    found = parts.first_step(options.parse_args([]), Budget(100.0))
    assert parts.ROUNDS == 3
    assert {s: found["sides"][s]["to_first_result_ms"] for s in rounds} == {
        "ours": 2000.0, "flash": 1500.0, "default": 1100.0}
    assert found["sides"]["ours"]["rounds_ms"] == [3000.0, 1000.0, 2000.0]


def test_each_fine_tune_step_is_its_median_over_the_processes(monkeypatch):
    steps = {"ours": iter([[30.0, 5.0], [10.0, 7.0], [20.0, 6.0]]), "flash": iter([[9.0, 4.0]] * 3),
             "default": iter([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])}

    def fake(part, side, args, timeout_s, env=None):
        return {"status": "ok", "step_ms": next(steps[side])}

    monkeypatch.setattr(parts, "run_fresh", fake)
    found = parts.finetune(options.parse_args([]), Budget(100.0))
    assert found["sides"]["ours"]["step_ms"] == [20.0, 6.0]
    assert found["sides"]["ours"]["rounds_step_ms"] == [[30.0, 5.0], [10.0, 7.0], [20.0, 6.0]]
    assert found["sides"]["default"]["step_ms"] == [2.0, 2.0]


def test_processes_per_side_follow_the_option(monkeypatch):
    started = []

    def fake(part, side, args, timeout_s, env=None):
        started.append(side)
        return {"status": "ok", "step_ms": [float(len(started))]}

    monkeypatch.setattr(parts, "run_fresh", fake)
    found = parts.finetune(options.parse_args(["--processes", "5"]), Budget(100.0))
    assert started.count("ours") == started.count("flash") == 5
    assert len(found["sides"]["ours"]["rounds_step_ms"]) == 5
    started.clear()
    parts.finetune(options.parse_args([]), Budget(100.0))
    assert started.count("ours") == parts.ROUNDS


@pytest.mark.parametrize("value", ["4", "0", "three", "-3"])
def test_processes_must_be_an_odd_whole_number(value, capsys):
    with pytest.raises(SystemExit) as exited:
        options.parse_args(["--processes", value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--processes" in err and "must be an odd whole number" in err


def test_first_calls_and_tiny_calls_are_medians_over_the_processes(monkeypatch):
    # Skewed values whose medians come from different processes: neither a mean nor one median process.
    tiny = {"ours": iter([(90.0, 10.0), (50.0, 30.0), (55.0, 20.0)]), "flash": iter([(9.0, 9.0)] * 3),
            "default": iter([(1.0, 3.0), None, (3.0, 1.0)])}
    first_ms = {"ours": iter([100.0, 300.0, 120.0]), "flash": iter([5.0] * 3), "default": iter([6.0] * 3)}

    def fake(part, side, args, timeout_s, env=None):
        ms, figures = next(first_ms[side]), next(tiny[side])
        if figures is None:
            return {"status": "failed: exit code 1: boom"}
        return {"status": "ok", "steps": _steps(ms, 1.0),
                "tiny_us": {"shape": "b1", "first": figures[0], "calls_2_101_median": figures[1]}}

    monkeypatch.setattr(parts, "run_fresh", fake)
    found = parts.first_calls(options.parse_args([]), Budget(100.0))["sides"]
    assert [s["ms"] for s in found["ours"]["steps"]] == [120.0, 1.0]
    assert found["ours"]["tiny_us"] == {"shape": "b1", "first": 55.0, "calls_2_101_median": 20.0}
    assert [r["steps_ms"][0] for r in found["ours"]["rounds"]] == [100.0, 300.0, 120.0]
    # A failed process stays in the rounds with its status; the median is over the finished ones.
    assert [r["status"] for r in found["default"]["rounds"]] == ["ok", "failed: exit code 1: boom", "ok"]
    assert found["default"]["processes_measured"] == 2 and found["default"]["tiny_us"]["first"] == 1.0


def test_a_side_with_no_finished_first_calls_keeps_its_failure_over_a_skip():
    runs = [{"status": "failed: exit code 1: boom"}, {"status": "skipped: time budget"}]
    assert parts._median_first_calls(runs) == {"status": "failed: exit code 1: boom"}


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


def test_a_part_that_raises_is_recorded_and_the_run_goes_on():
    def broken(plan, budget):
        raise RuntimeError("no device")

    found = parts.run_part("big_shape", broken, options.parse_args([]), Budget(100.0))
    assert found["status"] == "failed: RuntimeError: no device" and found["rows"] == [5]
    spent = parts.run_part("big_shape", broken, options.parse_args([]), Budget(5.0))
    assert spent["status"] == "skipped: time budget"


def test_a_worker_answers_from_a_fresh_process_on_cpu(monkeypatch):
    pytest.importorskip("torch")
    need_cpu_flash_with_grouped_kv()
    monkeypatch.setenv("FIRST_CONTACT_DEVICE", "cpu")
    found = processes.run_fresh("first_step", "flash", {"shape": [1, 32, 2, 1, 16]}, 120.0)
    assert found["status"] == "ok", found
    assert found["spawned_at"] < found["first_result_at"] and found["process_s"] > 0
    assert found["side"] == "flash" and found["shape"] == "b1 s32 h2/1 d16 causal bf16"


def test_a_failing_worker_reports_its_error():
    found = processes.run_fresh("nope", "ours", {}, 60.0)
    assert found["status"].startswith("failed: exit code 1: ValueError: part='nope'")
    assert "Traceback" in found["stderr_tail"]


def test_native_row_is_skipped_where_the_module_is_not_built(monkeypatch):
    monkeypatch.setattr(native_turns, "ensure_built", lambda where, budget: {
        "dir": where, "status": {"built": False, "problem": "no CUDA toolkit found (set CUDA_HOME)"}})
    found = native_turns.native(options.parse_args([]), Budget(100.0))
    assert found["status"] == "skipped: not built (no CUDA toolkit found (set CUDA_HOME))"
    assert "settings" not in found  # no worker was started


def test_native_turns_alternate_two_live_workers_on_cpu(monkeypatch):
    """Row 7's protocol end to end with a one-layer model on CPU: both workers settle, take every turn
    and stop; the module is reported as not loaded (none is built here)."""
    pytest.importorskip("transformers")
    tiny = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 500, "max_position_embeddings": 512}
    monkeypatch.setenv("FIRST_CONTACT_DEVICE", "cpu")
    monkeypatch.setitem(options.GENERATE, "llama", (tiny, 1, 16, 4, 20))
    monkeypatch.setattr(options, "FINETUNE", tiny)
    monkeypatch.setattr(options, "NATIVE_TRAIN_LENGTH", 16)
    monkeypatch.setattr(options, "NATIVE_FP8", {"layers": 1, "batch": 1, "length": 16, "hidden": 64, "heads": 4,
                                                "kv_heads": 2, "ffn": 128})
    monkeypatch.setattr(native_turns, "ensure_built", lambda where, budget: {"dir": where, "status": {"built": True}})
    found = native_turns.native(options.parse_args(["--quick"]), Budget(200.0))
    assert found["status"] == "ok" and found["turns"] == 3, found
    for label in ("on", "off"):
        setting = found["settings"][label]
        assert len(setting["generate_tokens_per_s"]) == 6 and len(setting["train_step_ms"]) == 9
        assert len(setting["fp8_forward_ms"]) == 9
        assert setting["ready"]["ready"] and setting["final"]["stopped"]
    assert found["note"] == "the compiled module was not loaded in the FUSEDATTN_SELECT_NATIVE=1 process"


# ----- the code itself ---------------------------------------------------------------------------------
def test_importing_the_tool_imports_no_gpu_stack():
    """Row 6 times a worker's imports: the tool's own modules must import only the standard library."""
    code = ("import sys\n"
            "for name in ('torch', 'cudnn', 'transformers', 'fusedattn_select'):\n"
            "    sys.modules[name] = None\n"
            "import importlib\n"
            f"for name in {MODULES!r}:\n"
            "    importlib.import_module('tools.first_contact.' + name)\n"
            "import tools.bench_first_contact\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_modules_and_functions_stay_short(path):
    source = path.read_text()
    assert len(source.splitlines()) <= 500
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno - node.lineno + 1 <= 80, f"{path.name}: {node.name}"


# ----- one document from runs that each measured some parts -----------------------------------------
def _run_document(parts_measured, commit, **changes):
    document = {"schema": "fusedattn-first-contact/1", "command": f"python -m tools.bench_first_contact ({commit})",
                "date": "2026-11-27 00:00 UTC", "device": "GPU X", "torch": "2.11", "cudnn_backend": "9.19.0",
                "cudnn_frontend": "1.32.0", "git_commit": commit, "wall_s": 10.0, "budget_s": 100.0,
                "parts_selected": list(parts_measured),
                "parts": {name: copy.deepcopy(DOCUMENT["parts"][name]) for name in parts_measured}}
    document.update(changes)
    return document


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


def test_runs_of_some_parts_merge_into_one_document_with_every_verdict():
    from tools.first_contact import merge

    merged = merge.merge([_run_document(("first_calls", "generate", "finetune"), "aaa"),
                          _run_document(("big_shape", "first_step", "native"), "bbb")])
    whole = [v.as_json() for v in targets.evaluate(DOCUMENT)]
    assert merged["targets"] == whole and len(whole) == 15
    assert merged["git_commit"] == "aaa+bbb" and merged["wall_s"] == 20.0
    assert [run["git_commit"] for run in merged["merged_from"]] == ["aaa", "bbb"]
    assert "merged from 2 runs" in merged["table"]


def test_a_merged_document_merged_again_keeps_every_run_and_where_each_part_came_from():
    from tools.first_contact import merge

    first = merge.merge([_run_document(("first_calls", "generate"), "aaa"),
                         _run_document(("finetune",), "bbb", processes_per_side=7)])
    assert first["part_runs"] == {"first_calls": 0, "generate": 0, "finetune": 1}
    again = merge.merge([first, _run_document(("first_calls",), "ccc", processes_per_side=9)])
    assert [run["git_commit"] for run in again["merged_from"]] == ["aaa", "bbb", "ccc"]
    assert [run["processes_per_side"] for run in again["merged_from"]] == [None, 7, 9]
    assert again["part_runs"] == {"first_calls": 2, "generate": 0, "finetune": 1}
    assert "merged from 3 runs" in again["table"]
    # A merged document of before part_runs: each part from the last run that selected it.
    del first["part_runs"]
    assert merge.merge([first])["part_runs"] == {"first_calls": 0, "generate": 0, "finetune": 1}


def test_runs_on_different_devices_or_versions_do_not_merge(tmp_path, capsys):
    from tools.first_contact import merge

    with pytest.raises(ValueError, match="cudnn_frontend"):
        merge.merge([_run_document(("first_calls",), "a"), _run_document(("native",), "b", cudnn_frontend="1.28.0")])
    paths = []
    for name, document in (("a", _run_document(("first_calls",), "a")), ("b", _run_document(("native",), "b",
                                                                                            device="GPU Y"))):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(__import__("json").dumps(document))
    assert merge.main(["-o", str(tmp_path / "out.json"), *map(str, paths)]) == 2
    assert "device" in capsys.readouterr().err and not (tmp_path / "out.json").exists()
