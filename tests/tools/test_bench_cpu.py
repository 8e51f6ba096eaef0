"""CPU smoke test of the benchmark's (tools.bench) pure parts: statistics, formatting, arguments,
JSON schema, markdown rendering. Nothing here times anything or needs a GPU."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import tools.bench
from tools.bench import common, dispatch, document, options, probe_cost, problems, warm_start

ROOT = Path(__file__).resolve().parents[2]
BENCH_MODULES = sorted(m.name for m in pkgutil.iter_modules(tools.bench.__path__))


# ----- statistics ------------------------------------------------------------------------------
def test_summarize_median_and_quartiles():
    s = common.summarize([5, 1, 4, 2, 3], "ms")
    assert s == {"median": 3.0, "p25": 2.0, "p75": 4.0, "min": 1.0, "max": 5.0, "n": 5, "unit": "ms"}


def test_summarize_small_samples_use_min_max_and_drop_missing():
    s = common.summarize([2.0, None, float("nan"), 4.0, float("inf")])
    assert (s["median"], s["p25"], s["p75"], s["n"]) == (3.0, 2.0, 4.0, 2)
    one = common.summarize([7])
    assert (one["median"], one["min"], one["max"], one["n"]) == (7.0, 7.0, 7.0, 1)
    assert common.summarize([]) is None
    assert common.summarize([None, float("nan")]) is None


def test_ratio_of_medians():
    a, b = common.summarize([2, 4, 6]), common.summarize([1, 2, 3])
    assert common.ratio(a, b) == pytest.approx(2.0)
    assert common.ratio(3.0, 1.5) == pytest.approx(2.0)
    assert common.ratio(a, None) is None
    assert common.ratio(a, 0) is None
    assert common.ratio({"status": "failed: x"}, b) is None


def test_flops_and_tflops():
    # 4*B*H*Sq*Skv*D, halved for causal
    assert common.attention_flops(2, 32, 8192, 8192, 128) == 4 * 2 * 32 * 8192 * 8192 * 128
    assert common.attention_flops(2, 32, 8192, 8192, 128, causal=True) == 2 * 2 * 32 * 8192 * 8192 * 128
    # different V head dim: 2*B*H*Sq*Skv*(Dqk+Dv)
    assert common.attention_flops(1, 1, 10, 10, 192, 128) == 2 * 100 * 320
    assert common.tflops(1e12, 1000.0) == pytest.approx(1.0)
    assert common.tflops(1e12, None) is None
    assert common.tflops(None, 1.0) is None
    assert common.BACKWARD_FLOP_FACTOR == 2.5


def test_stride_subset_is_even_and_stable():
    items = list(range(100))
    picked = common.stride_subset(items, 4)
    assert picked == [0, 25, 50, 75]
    assert common.stride_subset(items, 200) == items
    assert common.stride_subset(items, 0) == []
    assert common.stride_subset(items, 48) == common.stride_subset(items, 48)
    assert len(set(common.stride_subset(items, 48))) == 48


# ----- formatting ------------------------------------------------------------------------------
def test_number_and_stat_formatting():
    assert common.fmt_num(1234.4) == "1234"
    assert common.fmt_num(12.345) == "12.3"
    assert common.fmt_num(1.2345) == "1.23"
    assert common.fmt_num(0.012345) == "0.0123"
    assert common.fmt_num(0) == "0"
    assert common.fmt_num(None) == "n/a"
    assert common.fmt_num(float("nan")) == "n/a"
    assert common.fmt_stat(common.summarize([1, 2, 3, 4, 5])) == "3.00 [2.00–4.00]"
    assert common.fmt_stat(common.summarize([1, 3])) == "2.00 (1.00–3.00)"
    assert common.fmt_stat(common.summarize([3])) == "3.00 (n=1)"
    assert common.fmt_stat(None) == "n/a"
    assert common.fmt_ratio(2.0) == "2.00x"
    assert common.fmt_ratio(None) == "n/a"


def test_markdown_table_escapes_and_pads():
    table = common.md_table(("a", "b", "c"), [("x|y", "two\nlines"), (1, None, 3.5, "extra")])
    lines = table.splitlines()
    assert lines[0] == "| a | b | c |"
    assert lines[1] == "|---|---|---|"
    assert lines[2] == "| x\\|y | two lines |  |"
    assert lines[3] == "| 1 |  | 3.5 |"


def test_sdpa_reason_keeps_the_specific_reasons():
    warnings = [
        "Memory efficient kernel not used because: (Triggered internally at /pytorch/aten/x.cpp:986.)",
        "For dense input, both fused kernels require query, key and value to have the same num_heads. "
        "(Triggered internally at /pytorch/aten/y.cpp:99.)",
        "Flash attention kernel not used because: (Triggered internally at /pytorch/aten/x.cpp:988.)",
        "Flash attention requires q, k and v to have the same last dimension (Triggered internally at z.cpp:1.)",
    ]
    reason = dispatch.sdpa_reason("No available kernel. Aborting execution.", warnings)
    assert reason == ("n/a: For dense input, both fused kernels require query, key and value to have the same "
                      "num_heads.; Flash attention requires q, k and v to have the same last dimension")
    assert dispatch.sdpa_reason("No available kernel. (Triggered internally at a.cpp:1.)", []) == \
        "n/a: No available kernel."


def test_status_helpers():
    assert common.failed("boom\nsecond line") == "failed: boom"
    assert common.skipped() == "skipped: time budget"
    assert common.is_ok("ok") and not common.is_ok("failed: x")
    items = [{"k": 1, "status": "ok"}, {"k": 2, "status": "failed: x"}]
    assert common.combined_status(items, "k").startswith("partial: 1 of 2")
    assert common.combined_status(items[:1], "k") == "ok"
    assert common.combined_status(items[1:], "k").startswith("failed: ")
    assert common.combined_status([{"k": 1, "status": "skipped: time budget"}], "k").startswith("skipped: ")
    assert common.combined_status([], "k").startswith("failed: ")


def test_clean_json_replaces_non_finite():
    doc = common.clean_json({"a": float("nan"), "b": (1, float("inf")), "c": {"d": object}})
    assert doc["a"] is None and doc["b"] == [1, None] and isinstance(doc["c"]["d"], str)
    json.dumps(doc, allow_nan=False)


# ----- arguments -------------------------------------------------------------------------------
def test_parse_args_defaults_and_out_resolution():
    args = options.parse_args([], environ={})
    assert args.out == Path("bench-out") and not args.quick
    assert args.budget == options.FULL_BUDGET_S
    assert args.sections == options.SECTIONS
    assert options.parse_args([], environ={"OUT": "/tmp/o"}).out == Path("/tmp/o")
    assert options.parse_args([], environ={"OUT": ""}).out == Path("bench-out")
    args = options.parse_args(["--out", "x", "--quick"], environ={"OUT": "/tmp/o"})
    assert args.out == Path("x") and args.quick and args.budget == options.QUICK_BUDGET_S
    assert options.parse_args(["--budget", "60"], environ={}).budget == 60.0


def test_parse_sections():
    assert options.parse_args(["--sections", "1,5"], environ={}).sections == ("selection", "dispatch")
    assert options.parse_args(["--sections", "dispatch,2"], environ={}).sections == ("probe_cost", "dispatch")
    with pytest.raises(SystemExit):
        options.parse_args(["--sections", "9"], environ={})
    with pytest.raises(SystemExit):
        options.parse_args(["--budget", "0"], environ={})


def test_plans_and_deadlines():
    quick, full = options.plan_for(True), options.plan_for(False)
    assert quick["mode"] == "quick" and full["mode"] == "full"
    for plan in (quick, full):
        assert sorted(j for kind, j in plan["warmup_runs"] if kind == "threads") == [1, 2, 4, 8]
        assert sorted(j for kind, j in plan["warmup_runs"] if kind == "processes") == [2, 4, 8]
        assert plan["warmup_runs"][0] == ("threads", 1)
    for name in ("llama-3-8b", "mistral-7b", "gemma-2-9b", "deepseek-v3-mla", "qwen2.5-7b", "gpt2"):
        assert name in quick["dispatch_files"] and name in full["dispatch_files"]
    deadlines = options.section_deadlines(1000.0, 450.0, False, options.RUN_ORDER)
    assert deadlines["env"] > 1000.0
    assert list(deadlines) == ["env", *options.RUN_ORDER]
    assert max(deadlines.values()) == pytest.approx(1450.0)
    assert all(a < b for a, b in zip(list(deadlines.values()), list(deadlines.values())[1:]))


def test_dispatch_entry_choice_and_sdpa_blocker():
    from fusedattn_select.config_files import load_config_file

    gpt2 = load_config_file(ROOT / "configs" / "gpt2.yaml")
    picked = problems.pick_dispatch_entries(gpt2.entries, 2)
    assert [e.name for e in picked] == ["train-bf16"]  # the fp16 entry has dropout
    for stem in options.DISPATCH_FILES_FULL:
        entries = load_config_file(ROOT / "configs" / f"{stem}.yaml").entries
        assert problems.pick_dispatch_entries(entries, 1), stem
    assert dispatch.sdpa_blocker("causal", (-1, -1), 8192, 8192) == ""
    assert dispatch.sdpa_blocker("causal", (-1, 0), 8192, 8192) == ""
    assert dispatch.sdpa_blocker("causal", (4095, 0), 4096, 4096) == ""  # the window never cuts
    assert "window" in dispatch.sdpa_blocker("causal", (4095, 0), 8192, 8192)
    assert "window" in dispatch.sdpa_blocker("no_mask", (128, 128), 1024, 1024)


# ----- schema and report -----------------------------------------------------------------------
def _doc():
    stat = common.summarize([1.0, 2.0, 3.0, 4.0], "us")
    ms = common.summarize([10.0, 11.0, 12.0, 13.0], "ms")
    return common.clean_json({
        "schema": common.SCHEMA,
        "meta": {"device": "Test GPU (sm_90)", "gpu": "Test GPU, 580.00", "driver": "580.00 (CUDA 13.0)",
                 "cudnn_backend": "9.19.0", "cudnn_frontend": "1.32.0", "torch": "2.11.0+cu130",
                 "library": "0.1.0", "python": "3.12", "date_utc": "2026-11-21 05:00 UTC",
                 "mode": "quick", "budget_s": 175},
        "sections": {
            "shapes": {"status": "skipped: not selected (--sections)"},
            "selection": {"status": "ok", "problem": "p", "calls": 10, "batches": 2, "rows": [
                {"name": "get_backend(cfg)", "us": stat, "answer": "F16"},
                {"name": "torch._fused_sdp_choice(q, k, v, ...)", "us": stat, "answer": "FLASH_ATTENTION"},
                {"name": "can_use_cudnn_attention(params)", "status": "n/a: no SDPAParams"},
            ]},
            "probe_cost": {"status": "failed: cuDNN missing"},
            "warm_start": {"status": "partial: 1 of 2 not ok", "runs": [
                {"kind": "cold", "status": "ok", "process_wall_s": 9.0, "select_s": 0.5, "first_step_s": 1.0,
                 "probes": 15, "persistent_hits": 0, "plan_builds": 2, "plan_build_ms": 800.0},
                {"kind": "warm", "status": "failed: worker exited with 1"},
            ], "summary": {}},
            "warmup_scaling": {"status": "partial: 1 of 2 not ok", "configs": 8, "suite": "s", "runs": [
                {"workers": "processes", "jobs": 8, "status": "skipped: time budget"},
                {"workers": "threads", "jobs": 1, "status": "ok", "wall_s": common.summarize([6.0], "s"),
                 "speedup": 1.0, "totals": {"accepted": 7, "rejected": 1, "failed": 0, "plans_built": 12},
                 "row_seconds_sum": 6.0, "init_s": 0.5}]},
            "dispatch": {"status": "ok", "configs": [{
                "file": "gpt2", "name": "train-bf16", "status": "ok", "shape": "bshd b8", "fwd_tflop": 0.1,
                "impls": [
                    {"name": "attention()", "status": "ok", "fwd_ms": ms, "bwd_ms": ms, "fwd_bwd_ms": ms,
                     "fwd_tflops": 500.0, "bwd_tflops": 400.0, "fwd_bwd_tflops": 420.0},
                    {"name": "torch SDPA FLASH_ATTENTION", "status": "n/a: window | size"},
                ]}],
                "fp8": {"status": "failed: no FP8"},
                "tiny": {"shape": "b1", "calls": 10, "rows": [{"name": "attention()", "us": stat}]}},
            "plan_rebuild": {"status": "ok", "problem": "p", "graphs": [
                {"phase": "forward", "status": "ok", "dynamic_shapes": [True, True],
                 "cold_ms": common.summarize([300.0], "ms"),
                 "new_batch_ms": common.summarize([3.0, 4.0, 5.0], "ms")}],
                "dispatch": {"status": "failed: no torch"}},
        },
        "notes": ["a note"],
        "wall_seconds": 12.5,
    })


def test_validate_result_accepts_a_complete_document():
    doc = _doc()
    assert document.validate_result(doc) == []
    json.dumps(doc, allow_nan=False)


def test_validate_result_names_problems():
    doc = _doc()
    doc["schema"] = "other"
    del doc["meta"]["torch"]
    del doc["sections"]["dispatch"]
    doc["sections"]["selection"]["status"] = "fine"
    doc["sections"]["warm_start"]["bad"] = {"median": 1.0, "n": 1}
    problems = document.validate_result(doc)
    text = "\n".join(problems)
    for needle in ("schema", "meta.torch", "sections.dispatch missing", "sections.selection.status",
                   "stat without"):
        assert needle in text
    assert document.validate_result([]) == ["document is not an object"]


def test_render_markdown_has_header_and_every_section():
    md = document.render_markdown(_doc())
    for needle in ("# fusedattn-select benchmark", "| device | Test GPU (sm_90) |", "| cuDNN backend | 9.19.0 |",
                   "| cudnn-frontend | 1.32.0 |", "| torch | 2.11.0+cu130 |", "| date | 2026-11-21 05:00 UTC |",
                   "| driver | 580.00 (CUDA 13.0) |"):
        assert needle in md, needle
    for title in options.SECTION_TITLES.values():
        assert f"## {title}" in md
    assert "**failed: cuDNN missing**" in md
    assert "| threads | 1 | 6.00 (n=1) | 1.00x | 7/1/0 | 12 | 6.00 | 0.5 |" in md
    assert "| processes | 8 | skipped: time budget |" in md
    assert "| get_backend(cfg) | 2.50 [1.75–3.25] | 1.00x | F16 |" in md
    assert "n/a: no SDPAParams" in md
    assert "n/a: window \\| size" in md  # pipes in a reason cannot break the table
    assert "| attention() | 11.5 [10.8–12.2]" in md
    assert "| forward (dynamic) | 300 (n=1) | 4.00 (3.00–5.00) |" in md
    assert "failed: worker exited with 1" in md
    assert "FP8: failed: no FP8" in md
    assert md.endswith("\n")


def test_render_markdown_survives_a_broken_section():
    doc = _doc()
    doc["sections"]["dispatch"]["configs"] = [{"file": "x", "name": "y", "impls": [{"status": "ok"}]}]
    md = document.render_markdown(doc)
    assert "## 5. Dispatch" in md


def test_write_outputs_writes_json_and_markdown(tmp_path):
    json_path, md_path = document.write_outputs(_doc(), tmp_path / "out")
    loaded = json.loads(json_path.read_text())
    assert loaded["schema"] == common.SCHEMA and "schema_problems" not in loaded
    assert md_path.read_text().startswith("# fusedattn-select benchmark")
    broken = _doc()
    del broken["wall_seconds"]
    json_path, _ = document.write_outputs(broken, tmp_path / "broken")
    assert json.loads(json_path.read_text())["schema_problems"] == ["wall_seconds missing"]


def test_render_prints_the_markdown_the_run_wrote_from_its_json_alone(tmp_path, capsys):
    from tools.bench.main import main

    json_path, md_path = document.write_outputs(_doc(), tmp_path / "out")
    written = md_path.read_text()
    md_path.unlink()  # tools/results keeps only the JSON
    assert main(["--render", str(json_path)]) == 0
    assert capsys.readouterr().out == written


def test_probe_aggregation():
    def graph(phase, full_ms, seen=False, outcome="supported"):
        return {"phase": phase, "fast_ms": 4.0, "full_ms": full_ms, "rebuild_ms": 3.0, "build_plans_ms": full_ms - 5,
                "class_seen_in_process": seen, "full": {"outcome": outcome}}

    entries = [
        {"name": "a", "graphs": [graph("forward", 300.0), graph("backward", 500.0)],
         "memory_hit_us": common.summarize([2.0])},
        {"name": "b", "graphs": [graph("forward", 10.0, seen=True)], "memory_hit_us": common.summarize([4.0])},
        {"name": "c", "graphs": [graph("forward", 6.0, outcome="unsupported")]},
        {"name": "d", "status": "skipped: time budget", "graphs": []},
    ]
    summary = probe_cost.probe_summary(entries)
    assert (summary["graphs"], summary["supported"], summary["rejected"]) == (4, 3, 1)
    assert summary["full_cold_fwd_ms"]["median"] == 300.0 and summary["full_cold_fwd_ms"]["n"] == 1
    assert summary["full_class_seen_ms"]["median"] == 10.0
    assert summary["memory_hit_us"]["median"] == 3.0
    files = [{"file": "f", "import_cudnn_ms": 20.0, "engine_init_ms": 150.0, "entries": entries, "summary": summary}]
    agg = probe_cost.aggregate_probe_cost(files)
    assert agg["init"]["engine_init_ms"]["median"] == 150.0
    assert agg["init"]["first_probe_ms"]["median"] == 4.0
    assert agg["all"]["full_cold_bwd_ms"]["median"] == 500.0
    assert agg["ratios"]["full_over_fast_fwd"] == pytest.approx(75.0)
    assert agg["ratios"]["cold_over_memory_hit"] == pytest.approx(300.0 / 0.003)
    assert "_samples" not in files[0]["summary"]


def test_warm_start_summary():
    runs = [{"kind": "cold", "status": "ok", "select_s": 2.0, "process_wall_s": 10.0},
            {"kind": "warm", "status": "ok", "select_s": 0.5, "process_wall_s": 8.0},
            {"kind": "warm", "status": "ok", "select_s": 1.5, "process_wall_s": 8.0},
            {"kind": "warm+jit", "status": "ok", "select_s": 0.25, "process_wall_s": 5.0},
            {"kind": "cold-full", "status": "ok", "select_s": 6.0},
            {"kind": "warm-full", "status": "failed: x", "select_s": 0.1}]
    s = warm_start.warm_start_summary(runs)
    assert s["select_s"]["ratio"] == pytest.approx(2.0)
    assert s["select_s"]["ratio_jit"] == pytest.approx(8.0)
    assert s["process_wall_s"]["warm"]["n"] == 2
    assert "first_step_s" not in s  # no run measured it
    assert s["select_s_depth_full"]["warm"] is None and s["select_s_depth_full"]["ratio"] is None
    doc = {"runs": runs, "summary": s, "file": "f", "step": "st", "entries": 11}
    md = warm_start.render(doc)
    assert "| select all | 2.00 (n=1) | 1.00 (0.5–1.50) | 0.25 (n=1) | 2.00x | 8.00x |" in md


def _module_level_imports(path: Path) -> set[str]:
    """Top-level names of the modules `path` imports outside any function or class."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("module", BENCH_MODULES)
def test_module_level_imports_no_gpu_stack(module):
    """No module of the benchmark imports torch, cuDNN or the library when imported (workers import
    them inside the measurement; a worker's first import of the library is timed)."""
    imported = _module_level_imports(ROOT / "tools" / "bench" / f"{module}.py")
    for name in ("torch", "cudnn", "cuda", "fusedattn_select"):
        assert name not in imported, f"tools/bench/{module}.py imports {name}"


def test_the_package_imports_and_reports_without_torch_or_cudnn():
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['cudnn'] = None\n"
        "import importlib\n"
        f"for name in {BENCH_MODULES!r}:\n"
        "    if name != '__main__':\n"
        "        importlib.import_module('tools.bench.' + name)\n"
        "print('library imported:', 'fusedattn_select' in sys.modules)\n"
        "from tools.bench import document\n"
        "print(document.render_markdown({'sections': {}}).splitlines()[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["library imported: False", "# fusedattn-select benchmark"]


def test_help_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "tools.bench", "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--out", "--quick", "--budget", "--sections"):
        assert flag in out.stdout


def test_non_training_entries_are_not_picked_for_dispatch():
    entry = SimpleNamespace(name="x", config=SimpleNamespace(is_training=False))
    assert problems.pick_dispatch_entries([entry], 1) == []


def test_tensor_views_follow_the_library_layouts():
    torch = pytest.importorskip("torch")
    from tools.bench import tensors

    t = torch.zeros(2, 5, 3, 4)  # bshd: batch 2, seqlen 5, heads 3, head_dim 4
    assert tuple(tensors.to_bhsd(t, "bshd").shape) == (2, 3, 5, 4)
    assert tuple(tensors.to_bhsd(torch.zeros(5, 2, 3, 4), "sbhd").shape) == (2, 3, 5, 4)
    out = torch.zeros(2, 3, 5, 4)
    assert tuple(tensors.from_layout(t, "bshd", out).shape) == (2, 3, 5, 4)
    assert tensors.rel_err(torch.ones(3), torch.ones(3)) == 0.0


def test_tiny_rows_compare_within_their_kind_and_name_the_path():
    from tools.bench import host_overhead

    def stat(us):
        return common.summarize([us], "us")

    rows = [{"name": name, "kind": host_overhead._kind(name), "us": stat(us)} for name, us in (
        ("attention()", 20.0), ("torch SDPA (its default backend choice)", 30.0),
        ("attention()" + host_overhead.TRAINING, 200.0),
        ("torch SDPA (its default backend choice)" + host_overhead.TRAINING, 100.0),
        ("attention()" + host_overhead.TRAINING + host_overhead.CALLING_THREAD, 80.0),
        ("torch SDPA (its default backend choice)" + host_overhead.TRAINING + host_overhead.CALLING_THREAD, 120.0))]
    text = host_overhead.render({"shape": "b1", "calls": 10, "rows": rows,
                                 "attention_path": {"inference": "compiled", "training": "python"}})
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert lines["torch SDPA (its default backend choice)"].endswith("| 1.50x |")
    assert lines["torch SDPA (its default backend choice) fwd+bwd (training)"].endswith("| 0.5x |")
    assert lines["torch SDPA (its default backend choice) fwd+bwd (training), autograd on the calling "
                 "thread"].endswith("| 1.50x |")
    assert "compiled path for inference and the python path for training" in text
    # a result recorded before rows carried their kind renders by name alike
    assert "on the calling thread turn autograd's device thread off" in text
    old = host_overhead.render({"rows": [{k: v for k, v in r.items() if k != "kind"} for r in rows]})
    assert old.count("| 1.50x |") == 2
    assert "device thread off" not in host_overhead.render({"rows": rows[:4]})


@pytest.mark.parametrize("tool", ["bench_amax", "bench_bindings", "bench_cache_slices", "bench_distributed",
                                  "bench_first_contact", "bench_fp8_overlap", "record_fp8_speed"])
def test_standalone_tool_help_runs_without_torch_or_cudnn(tool):
    """The standalone GPU tools import torch and cuDNN only when they measure: --help works anywhere."""
    code = ("import runpy, sys\n"
            "sys.modules['torch'] = None\n"
            "sys.modules['cudnn'] = None\n"
            f"sys.argv = ['{tool}', '--help']\n"
            f"runpy.run_module('tools.{tool}', run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:"), out.stdout
