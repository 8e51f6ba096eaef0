"""CPU tests of the benchmark's shape-bucket section (tools.bench.shapes): what each mode measures,
the registry and arguments, the parent's part deadlines, target evaluation and the report. The
measurements themselves need the GPU machine."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tools.bench import common, document, options, sections, shapes
from tools.bench import shapes_attention as sa
from tools.bench import shapes_hf as hf


# ----- plan, registry, arguments -----------------------------------------------------------------
def test_plan_has_the_issue_shapes_and_quick_shrinks():
    full, quick = shapes.shapes_plan(False), shapes.shapes_plan(True)
    assert full["first_call"]["shapes"] == [[2, 1000], [2, 1100], [3, 1100], [2, 1234], [1, 2048], [4, 777]]
    assert full["steady"]["batches"] == [1, 2, 4]
    assert full["steady"]["seqlens"] == [129, 512, 777, 1024, 2048, 4096]
    assert full["generate"]["impls"] == ["fusedattn", "sdpa", "sdpa+flash"]
    assert full["generate"]["caches"] == ["dynamic", "static"]
    assert (full["generate"]["prompt"], full["generate"]["new_tokens"]) == (200, 32)
    assert full["finetune"]["impls"] == ["fusedattn", "sdpa+flash", "sdpa+cudnn", "no-attention"]
    assert (full["finetune"]["layers"], full["finetune"]["batch"], full["finetune"]["steps"]) == (4, 4, 10)
    assert full["finetune"]["lengths"] == [300, 1100]
    n = lambda p: len(p["steady"]["batches"]) * len(p["steady"]["seqlens"])  # noqa: E731
    assert n(quick) < n(full) == 18
    assert quick["steady"]["reps"] < full["steady"]["reps"]
    assert quick["finetune"]["steps"] < full["finetune"]["steps"]
    # every shape of part A is a new shape: not the warm shape
    assert full["first_call"]["warm_shape"] not in full["first_call"]["shapes"]


def test_models_match_the_issue():
    small, big = hf.MODELS["llama-small"], hf.MODELS["llama-3-8b-dims-2-layers"]
    assert (small["hidden_size"], small["intermediate_size"], small["num_hidden_layers"]) == (1024, 2816, 8)
    assert (small["num_attention_heads"], small["num_key_value_heads"], small["vocab_size"]) == (16, 4, 32000)
    assert (big["hidden_size"], big["intermediate_size"], big["num_hidden_layers"]) == (4096, 14336, 2)
    assert (big["num_attention_heads"], big["num_key_value_heads"], big["head_dim"]) == (32, 8, 128)
    assert big["vocab_size"] == 128256
    assert "4 layers" in hf.model_text("llama-small", 4) and "head dim 64" in hf.model_text("llama-small")


def test_section_is_registered_and_selectable():
    assert sections.RUNS["shapes"] is shapes.run
    assert sections.RENDERERS["shapes"] is shapes.render
    assert sections.WORKERS["shapes"] is shapes.worker
    assert "shapes" in options.SECTIONS and "shapes" in options.RUN_ORDER
    assert options.SECTION_TITLES["shapes"].startswith("7.")
    assert options.parse_args(["--sections", "shapes"], environ={}).sections == ("shapes",)
    assert options.parse_args(["--sections", "7,1"], environ={}).sections == ("selection", "shapes")
    with pytest.raises(SystemExit):
        options.parse_args(["--sections", "8"], environ={})
    for quick in (True, False):
        shares = options.SHARES_QUICK if quick else options.SHARES_FULL
        budget = options.QUICK_BUDGET_S if quick else options.FULL_BUDGET_S
        assert budget >= sum(shares.values())
        deadlines = options.section_deadlines(0.0, budget, quick, ["shapes"])
        assert deadlines["shapes"] == pytest.approx(budget)


def test_lengths_are_seeded_and_in_range():
    a = hf.draw_lengths(0, 10, 300, 1100)
    assert a == hf.draw_lengths(0, 10, 300, 1100)
    assert len(a) == 10 and all(300 <= x <= 1100 for x in a)
    assert len(set(a)) > 5  # a new length (nearly) every step
    assert hf.draw_lengths(1, 10, 300, 1100) != a


def test_rotated_changes_who_goes_first():
    names = [sa.ATTENTION, sa.SDPA_CUDNN, sa.SDPA_FLASH]
    firsts = [sa.rotated(names, i)[0] for i in range(6)]
    assert firsts == names + names
    assert sorted(sa.rotated(names, 4)) == sorted(names)
    assert sa.rotated([], 3) == []


# ----- the parent run ----------------------------------------------------------------------------
class _FakeRunner:
    """A Runner whose workers return canned part results (records what they were asked)."""

    def __init__(self, results: dict, quick: bool = False, remaining: float = 200.0) -> None:
        self.plan = {"mode": "quick" if quick else "full"}
        self.results, self.calls, self.left = results, [], remaining

    def remaining(self, section: str) -> float:
        assert section == "shapes"
        return self.left

    def worker(self, name: str, wargs: dict, section: str, label: str = "") -> dict:
        self.calls.append((name, dict(wargs), section, label))
        return dict(self.results.get(wargs["part"], {"status": "failed: worker exited with 1"}), _wall_s=1.5)


def test_run_gives_each_part_a_cumulative_deadline_and_evaluates_targets():
    runner = _FakeRunner({"first_call": _first_call_part(), "steady": _steady_part(),
                          "generate": _generate_part(), "finetune": _finetune_part()})
    started = time.time()
    out = shapes.run(runner)
    assert [c[1]["part"] for c in runner.calls] == list(shapes.PARTS)
    assert all(c[0] == "shapes" and c[2] == "shapes" and c[3] == c[1]["part"] for c in runner.calls)
    deadlines = [c[1]["deadline"] for c in runner.calls]
    assert all(a < b for a, b in zip(deadlines, deadlines[1:]))
    assert started + 199 <= deadlines[-1] <= time.time() + 200
    assert runner.calls[1][1]["seqlens"] == [129, 512, 777, 1024, 2048, 4096]
    assert out["status"] == "ok"
    assert out["parts"]["steady"]["wall_s"] == 1.5 and "_wall_s" not in out["parts"]["steady"]
    assert [(t["part"], t["met"]) for t in out["targets"]] == [
        ("A", True), ("A", False), ("A", None), ("B", True), ("B", False), ("B", None), ("B", True), ("B", True),
        ("B", None), ("C", True), ("C", None), ("D", True), ("D", False), ("D", True), ("D", True)]


def test_run_reports_failed_parts_and_unmeasured_targets():
    finetune = _finetune_part()
    finetune["runs"][0] = {"impl": hf.FUSEDATTN, "status": "failed: RuntimeError: boom"}
    runner = _FakeRunner({"first_call": _first_call_part(), "finetune": finetune}, quick=True)
    out = shapes.run(runner)
    assert out["status"].startswith("partial: 2 of 4 not ok; first steady: failed: worker exited with 1")
    assert runner.calls[1][1]["reps"] == shapes.shapes_plan(True)["steady"]["reps"]
    assert {t["part"] for t in out["targets"]} == {"A", "D"}  # parts without rows have no targets
    d = [t for t in out["targets"] if t["part"] == "D"]
    assert [(t["met"], t["why"]) for t in d] == [(None, "fusedattn: failed: RuntimeError: boom")] * 4


# ----- targets -----------------------------------------------------------------------------------
def _first_call_part() -> dict:
    def att(ms, builds):
        return {sa.ATTENTION: {"status": "ok", "first_ms": ms, "again_ms": 0.5, "plan_builds": builds,
                               "plan_loads": 0},
                sa.SDPA_CUDNN: {"status": "ok", "first_ms": 150.0},
                sa.SDPA_FLASH: {"status": "failed: RuntimeError: no kernel"}}

    return {"status": "ok", "problem": "h32/8 d128", "warm_shape": [4, 2048],
            "impls": {sa.ATTENTION: {"status": "ok", "note": ""},
                      sa.SDPA_CUDNN: {"status": "ok", "note": "K/V repeated to 32 heads"}},
            "rows": [{"batch": 2, "seqlen": 1000, "bucket": [2, 1024], "order": [sa.ATTENTION], "impls": att(2.0, 0)},
                     {"batch": 2, "seqlen": 1100, "bucket": [2, 2048], "impls": att(1.0, 2)},
                     {"batch": 4, "seqlen": 777, "bucket": [4, 1024], "status": "skipped: time budget"}]}


def _steady_part() -> dict:
    ms = lambda x: common.summarize([x, x, x, x], "ms")  # noqa: E731

    def row(b, s, att, dense):
        return {"batch": b, "seqlen": s, "bucket": [b, 512], "status": "ok", "check_rel_err": 0.002,
                "attention_over_dense": att / dense, "attention_over_flash": att / 2.0,
                "attention_over_dense_kernels": 1.0, "same_kernels": b == 1,
                "impls": {sa.ATTENTION: {"status": "ok", "fwd_bwd_ms": ms(att), "kernel_ms": 0.5},
                          sa.RAW_DENSE: {"status": "ok", "fwd_bwd_ms": ms(dense), "kernel_ms": 0.5},
                          sa.SDPA_FLASH: {"status": "ok", "fwd_bwd_ms": ms(2.0)}}}

    failed = {"batch": 4, "seqlen": 4096, "bucket": [4, 4096], "status": "ok", "attention_over_dense": None,
              "impls": {sa.ATTENTION: {"status": "ok", "fwd_bwd_ms": ms(1.0)},
                        sa.RAW_DENSE: {"status": "failed: CudnnError: no engine"}}}
    return {"status": "ok", "problem": "h32/8", "rows": [row(1, 512, 1.02, 1.0), row(2, 512, 1.03, 1.0), failed]}


def _generate_part() -> dict:
    tps = lambda x: common.summarize([x, x, x], "tokens/s")  # noqa: E731
    runs = [{"cache": "dynamic", "impl": hf.FUSEDATTN, "status": "ok", "tokens_per_s": tps(96.0),
             "attention_calls": {"fused_calls": 100, "fallback_calls": 0, "plan_builds": 0}},
            {"cache": "dynamic", "impl": hf.SDPA, "status": "ok", "tokens_per_s": tps(90.0)},
            {"cache": "dynamic", "impl": hf.SDPA_FLASH, "status": "ok", "tokens_per_s": tps(100.0)},
            {"cache": "static", "impl": hf.FUSEDATTN, "status": "ok", "tokens_per_s": tps(80.0)},
            {"cache": "static", "impl": hf.SDPA_FLASH, "status": "failed: RuntimeError: No available kernel"}]
    return {"status": "ok", "transformers": "4.57.0", "models": [{
        "name": "llama-small", "model": "llama-small: hidden 1024", "status": "ok", "runs": runs,
        "logits": {"status": "ok", "tokens": 208, "max_abs_diff": 0.03125, "max_abs_logit": 4.5,
                   "argmax_agreement": 0.995}}]}


def _finetune_part() -> dict:
    def run(impl, total, second=None):
        return {"impl": impl, "status": "ok", "total_ms": total, "per_step_ms": common.summarize([total / 10] * 10),
                "losses": [10.4, 10.3], "second_total_ms": second if second is not None else total}

    return {"status": "ok", "model": "llama-small 4 layers", "batch": 4, "step_lengths": [300, 1100],
            "warm_length": 200, "runs": [run(hf.FUSEDATTN, 900.0, 500.0), run(hf.SDPA_FLASH, 1000.0),
                                         run(hf.SDPA_CUDNN, 1200.0), run(hf.NO_ATTENTION, 400.0)]}


def test_first_call_target_is_time_and_builds():
    t = shapes.first_call_targets(_first_call_part()["rows"])
    assert [x["met"] for x in t] == [True, False, None]  # 2.0 ms is within; 2 builds miss
    assert t[0]["figure"] == "2.00 ms, 0 builds" and t[0]["item"] == "b2 s1000"
    assert t[2]["why"] == "skipped: time budget"
    assert shapes.verdict(t[0]) == "met" and shapes.verdict(t[1]) == "MISSED"
    assert shapes.verdict(t[2]) == "n/a (skipped: time budget)"


def test_a_fallback_misses_the_first_call_target():
    rows = _first_call_part()["rows"][:1]
    rows[0]["impls"][sa.ATTENTION]["fallback_calls"] = 1
    t = shapes.first_call_targets(rows)
    assert (t[0]["figure"], t[0]["met"]) == ("2.00 ms, fell back to torch SDPA", False)
    assert "2.00 (again 0.5) fell back" in shapes.render_first_call({"rows": rows})
    steady = _steady_part()["rows"][:1]
    steady[0]["attention_fused"] = False
    assert shapes.steady_targets(steady)[0]["met"] is False
    assert "| b1 s512 (fell back) |" in shapes.render_steady({"rows": steady})


def test_steady_target_is_98_percent_of_dense_speed():
    t = shapes.steady_targets(_steady_part()["rows"])
    # 1.02x time is within 1/0.98; 1.03x is not; then the same shapes by their kernels' time
    assert [x["met"] for x in t] == [True, False, None, True, True, None]
    assert t[0]["figure"] == "1.020x time (0.980x speed)"
    assert t[2]["why"] == t[5]["why"] == "failed: CudnnError: no engine"
    assert (t[3]["item"], t[3]["figure"]) == ("b1 s512 (GPU kernels)", "1.000x time (1.000x speed)")


def test_generate_target_is_95_percent_of_flash_and_names_a_missing_flash():
    t = shapes.generate_targets(_generate_part()["models"])
    assert [(x["item"], x["met"]) for x in t] == [("llama-small dynamic cache", True),
                                                  ("llama-small static cache", None)]
    assert t[0]["figure"] == "0.960x"
    assert t[1]["why"] == "flash: failed: RuntimeError: No available kernel"
    slow = _generate_part()["models"]
    slow[0]["runs"][0]["tokens_per_s"] = common.summarize([94.0], "tokens/s")
    assert shapes.generate_targets(slow)[0]["met"] is False


def test_finetune_targets_against_flash_and_cudnn():
    t = shapes.finetune_targets(_finetune_part()["runs"])
    assert [(x["item"], x["figure"], x["met"]) for x in t] == [
        ("total vs sdpa+flash", "0.900x", True), ("total vs sdpa+cudnn", "0.750x", False),
        ("total vs sdpa+flash (second pass)", "0.500x", True), ("total vs sdpa+cudnn (second pass)", "0.417x", True)]
    runs = _finetune_part()["runs"][:2] + [{"impl": hf.SDPA_CUDNN, "status": "failed: RuntimeError: x"}]
    assert shapes.finetune_targets(runs)[1] == shapes.target(
        "D", "total vs sdpa+cudnn", "n/a", "fusedattn / sdpa+cudnn total time <= 0.7", None, "failed: RuntimeError: x")


# ----- the report --------------------------------------------------------------------------------
def _section() -> dict:
    parts = {"first_call": _first_call_part(), "steady": _steady_part(), "generate": _generate_part(),
             "finetune": _finetune_part()}
    parts["first_call"]["versions"] = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130",
                                       "torch_cudnn": 91900, "cudnn_backend": 91900, "cudnn_frontend": "1.32.0"}
    return common.clean_json({"status": "ok", "parts": parts, "targets": shapes.evaluate(parts), "notes": ["n"]})


def test_render_shows_figures_targets_and_verdicts():
    md = shapes.render(_section())
    for needle in (
        "Measured on NVIDIA H100 80GB HBM3: torch 2.11.0+cu130", "cudnn-frontend 1.32.0", "transformers 4.57.0",
        "Targets: 8 met, 3 MISSED, 4 not measured.",
        "| A | b2 s1000 | 2.00 ms, 0 builds | <= 2.00 ms and 0 plan builds | met |",
        "| A | b2 s1100 | 1.00 ms, 2 builds | <= 2.00 ms and 0 plan builds | MISSED |",
        "| B | b2 s512 | 1.030x time (0.971x speed) | time / dense <= 1.0204 (speed >= 0.98x dense) | MISSED |",
        "| C | llama-small static cache | n/a | fusedattn / flash tokens/s >= 0.95 | n/a (flash: failed: "
        "RuntimeError: No available kernel) |",
        "| D | total vs sdpa+cudnn | 0.750x | fusedattn / sdpa+cudnn total time <= 0.7 | MISSED |",
        "### A. First call at a new shape", "class warmed on b4/s2048",
        "torch SDPA CUDNN_ATTENTION: K/V repeated to 32 heads",
        "| b2 s1000 | 2x1024 | 2.00 (again 0.5) | 0 | 0 | 150 | failed: RuntimeError: no kernel | attention() |",
        "| b4 s777 | 4x1024 | skipped: time budget |",
        "| b1 s512 | 1x512 | 1.02 [1.02–1.02] | 1.00 [1.00–1.00] | 2.00 [2.00–2.00] | 1.02x | 0.98x | 0.51x | 0.5 | 0.5 | 1.00x | yes | 0.002 |",
            "| b2 s512 | 2x512 | 1.03 [1.03–1.03] | 1.00 [1.00–1.00] | 2.00 [2.00–2.00] | 1.03x | 0.971x | 0.515x | 0.5 | 0.5 | 1.00x | no | 0.002 |",
        "failed: CudnnError: no engine",
        "Logits over 208 tokens, fusedattn vs sdpa: max abs diff 0.0312 (max |logit| 4.50), argmax agreement 99.5%",
        "| dynamic | fusedattn | 96.0 (96.0–96.0) | 0.96x | 100/0/0 |",
        "| static | sdpa+flash | failed: RuntimeError: No available kernel |",
        "step lengths [300, 1100] (warm step at 200)",
        "| sdpa+cudnn | 1200 | 120 [120–120] | 0.75x | 10.3 |",
    ):
        assert needle in md, needle


def test_render_survives_missing_and_failed_parts():
    assert shapes.render({}) == ""
    md = shapes.render({"parts": {"steady": {"status": "failed: worker exited with 1"},
                                  "generate": {"status": "skipped: time budget", "models": [
                                      {"name": "m", "status": "skipped: time budget", "runs": []}]}},
                        "targets": shapes.evaluate({})})
    assert "### B. Repeated shape" in md and "**failed: worker exited with 1**" in md
    assert "m — skipped: time budget" in md
    assert "Targets" not in md  # nothing to evaluate without rows


def test_section_goes_into_the_document():
    doc = {"schema": common.SCHEMA, "meta": {k: "x" for k in ("device", "date_utc", "mode", "torch",
                                                                "cudnn_backend", "cudnn_frontend", "driver")},
           "sections": {name: {"status": "skipped: not selected (--sections)"} for name in options.SECTIONS},
           "wall_seconds": 1.0}
    doc["sections"]["shapes"] = _section()
    assert document.validate_result(doc) == []
    md = document.render_markdown(doc)
    assert "## 7. Shape buckets" in md and "| D | total vs sdpa+flash | 0.900x |" in md
    assert "- n" in md  # the section's notes


# ----- transformers helpers (CPU) ----------------------------------------------------------------
def test_pinned_expand_kv_patches_and_restores_transformers_gqa_choice():
    pytest.importorskip("torch")
    hf_sdpa = pytest.importorskip("transformers.integrations.sdpa_attention")
    original = hf_sdpa.use_gqa_in_sdpa
    with hf.pinned(hf.SDPA_FLASH, expand_kv=True):
        assert hf_sdpa.use_gqa_in_sdpa(None, SimpleNamespace(), SimpleNamespace()) is False
    assert hf_sdpa.use_gqa_in_sdpa is original
    with pytest.raises(ValueError):
        with hf.pinned(hf.SDPA_CUDNN, expand_kv=True):
            raise ValueError("inside")
    assert hf_sdpa.use_gqa_in_sdpa is original
    with hf.pinned(hf.FUSEDATTN):
        assert hf_sdpa.use_gqa_in_sdpa is original


def test_set_implementation_switches_a_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from fusedattn_select.integrations.transformers import register

    register()
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    hf.set_implementation(model, hf.FUSEDATTN)
    assert model.config._attn_implementation == "fusedattn"
    hf.set_implementation(model, hf.SDPA_CUDNN)
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():  # the switched model still runs (CPU: fusedattn falls back, sdpa is torch's)
        assert model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 100)


def test_in_turns_rotates_rounds_gathers_samples_and_drops_a_failing_timer():
    from tools.bench import common

    calls: list[tuple[str, bool]] = []

    def timer(name: str, fail_at: int = -1) -> common.Timer:
        def run(first: bool) -> dict:
            calls.append((name, first))
            if sum(1 for n, _ in calls if n == name) - 1 == fail_at:
                raise RuntimeError(f"{name} broke")
            return {"ms": [float(len(calls))], "n": [1.0, 2.0]}
        return run

    out = common.in_turns([("a", timer("a")), ("b", timer("b")), ("c", timer("c", fail_at=1))], 3)
    # One round of each before the next round of any, the first mover rotating; c fails in its second
    # round and takes no third turn.
    assert [n for n, _ in calls] == ["a", "b", "c", "b", "c", "a", "a", "b"]
    assert [f for _, f in calls] == [True, True, True, False, False, False, False, False]
    assert out["a"] == {"ms": [1.0, 6.0, 7.0], "n": [1.0, 2.0] * 3}
    assert out["b"]["ms"] == [2.0, 4.0, 8.0]
    assert set(out["c"]) == {"error"} and str(out["c"]["error"]) == "c broke"
