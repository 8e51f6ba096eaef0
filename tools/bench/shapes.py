"""Section 7, shape buckets: attention() serving every (batch, seqlen) of a problem class from plans
built once per power-of-two bucket, measured side by side with torch SDPA and the dense cuDNN graph.

  A. first forward+backward call at a new shape of a warm class (wall ms, plan builds)
  B. a repeated shape: GPU time vs the exact dense raw cuDNN graph of the shape and torch flash
  C. transformers generate() tokens/s (dynamic and static cache) and fusedattn-vs-sdpa logits
  D. a fine-tuning loop whose sequence length changes every step

Each part runs in its own worker process (shapes_attention: A, B; shapes_hf: C, D); the parent
evaluates the targets (evaluate) and renders the report.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from tools.bench import common
from tools.bench import shapes_attention as sa
from tools.bench import shapes_hf as hf
from tools.bench.runner import Runner

SECTION = "shapes"
PARTS = ("first_call", "steady", "generate", "finetune")
PART_TITLES = {"first_call": "A. First call at a new shape of a warm class",
               "steady": "B. Repeated shape: GPU time vs the dense graph",
               "generate": "C. transformers generate()", "finetune": "D. Fine-tuning, a new length every step"}
# Cumulative share of the section's time each part may use (slack carries over to later parts).
PART_SHARES = {"first_call": 0.15, "steady": 0.35, "generate": 0.30, "finetune": 0.20}

FIRST_CALL_MS_MAX = 2.0
DENSE_SPEED_MIN = 0.98           # attention() speed / dense graph speed
GENERATE_VS_FLASH_MIN = 0.95     # fusedattn tokens/s / flash tokens/s
FINETUNE_VS_FLASH_MAX = 0.9      # fusedattn total time / flash total time
FINETUNE_VS_CUDNN_MAX = 0.7      # fusedattn total time / cuDNN SDPA total time

FIRST_CALL_SHAPES = ((2, 1000), (2, 1100), (3, 1100), (2, 1234), (1, 2048), (4, 777))


def shapes_plan(quick: bool) -> dict[str, dict]:
    """What each part measures (--quick: fewer shapes and repetitions)."""
    return {
        "first_call": {"warm_shape": [4, 2048], "shapes": [list(s) for s in FIRST_CALL_SHAPES]},
        "steady": {"batches": [1, 4] if quick else [1, 2, 4],
                   "seqlens": [129, 777, 2048, 4096] if quick else [129, 512, 777, 1024, 2048, 4096],
                   "reps": 10 if quick else 20, "warmup": 3 if quick else 5},
        "generate": {"models": list(hf.MODELS), "prompt": 200, "new_tokens": 32, "logit_extra": 8,
                     "reps": 2 if quick else 7, "caches": ["dynamic", "static"], "seed": 0,
                     "impls": [hf.FUSEDATTN, hf.SDPA, hf.SDPA_FLASH]},
        "finetune": {"model": "llama-small", "layers": 4, "batch": 4, "steps": 6 if quick else 10,
                     "lengths": [300, 1100], "seed": 0, "warm_length": 200,
                     "impls": [hf.FUSEDATTN, hf.SDPA_FLASH, hf.SDPA_CUDNN, hf.NO_ATTENTION]},
    }


_NOTES = [
    "A: wall ms of one forward+backward call including torch.cuda.synchronize, on new input tensors "
    "of a shape not seen before, after each implementation ran twice on the warm shape; the "
    "implementation that goes first rotates from shape to shape. 'again' = the next call, same shape. "
    "plan builds = dispatch_info()['plan_builds'] change over attention()'s first call.",
    "B: CUDA-event time of forward+backward (median of the repetitions, after warm-up calls); the dense "
    "graph is probing.cudnn.build_graph(depth=FULL, static) of the call's own (dense, bshd) config, "
    "executed with preallocated tensors (no autograd, no allocation); check = relative error of "
    "attention()'s forward output vs the dense graph's. The timed calls come after the shape reached "
    "its own plans (its dense_after calls, then until the worker process stored them). CUDA events "
    "around an eager call include the time the GPU waits for the host, which on small shapes is most "
    "of attention()'s (autograd, Python) and none of the raw graph's; 'kernels' is the GPU time of the "
    "kernels, copies and fills each launched (torch.profiler: the median of 3 profiles of 100 calls, "
    "attention() and the dense graph in turns), i.e. the plans' own speed; 'same kernels' says whether "
    "both launched kernels of the same names. Both are targets (B rows, and B rows marked '(GPU kernels)').",
    "C: random-init Llama (torch.manual_seed(0)), bf16, batch 1, greedy, min_new_tokens = max_new_tokens "
    "(no early stop), eager (generation_config.disable_compile=True: a static cache would otherwise "
    "compile the forward); tokens/s = new tokens / wall s of generate() including the prefill; short "
    "generate()s first (enough for the prompt's shape, called once per layer each, to reach its own "
    "plans), then one full-length generate() reported apart ('first': it meets every decode length "
    "once), then the median of the repetitions, which the implementations take in turn (the order "
    "rotating; after the worker process finished any plans it was asked for and one more short "
    "generate() each). Logits: one "
    "forward over prompt + a few tokens, no cache.",
    "D: each step is batch x length tokens with one length per step (the batch padded to its longest "
    "sequence, here all full length, so every implementation runs the same causal problem); forward, "
    "backward, AdamW step, wall ms with synchronize; one step at an unrelated length first. The second "
    "pass runs as many new lengths of the same range (seed + 1) right after, every bucket it needs "
    "built (as after `warmup` over the ladder): targets are read from both passes. The implementations "
    "step in turn (step i of each before step i + 1 of any, the order rotating), so a noisy host weighs "
    "on all alike. no-attention is the floor: an attention function that returns its queries, so its "
    "time is what the rest of the step costs. Before the timed steps at a length, one untimed step of the "
    "floor at that length pays the costs a new shape brings to the whole process (cuBLAS's GEMM "
    "heuristics, the caching allocator's new blocks), which otherwise fall on whichever implementation "
    "goes first (measured: 10-17 ms a step); it does no attention work, so each implementation's own "
    "new-shape cost (for fusedattn: its new call signature) stays in its time.",
]


# ----- parent ------------------------------------------------------------------------------------
def run(runner: Runner) -> dict:
    plan = shapes_plan(runner.plan["mode"] == "quick")
    start, total = time.time(), max(0.0, runner.remaining(SECTION))
    parts: dict[str, Any] = {}
    share = 0.0
    for part in PARTS:
        share += PART_SHARES[part]
        wargs = dict(plan[part], part=part, deadline=start + total * share)
        res = runner.worker("shapes", wargs, SECTION, label=part)
        res["wall_s"] = res.pop("_wall_s", None)
        parts[part] = res
    return {
        "status": common.combined_status([dict(r, part=p) for p, r in parts.items()], key="part"),
        "parts": parts,
        "targets": evaluate(parts),
        "notes": list(_NOTES),
    }


# ----- worker ------------------------------------------------------------------------------------
def worker(args: Mapping, res: common.Partial) -> None:
    import torch

    res["part"] = args["part"]
    res["versions"] = versions(torch)
    res.save()
    {"first_call": sa.first_calls, "steady": sa.steady, "generate": hf.generate,
     "finetune": hf.finetune}[args["part"]](torch, args, res)


def versions(torch: Any) -> dict[str, Any]:
    """The device and the versions a part ran with."""
    out: dict[str, Any] = {"torch": torch.__version__, "torch_cudnn": torch.backends.cudnn.version()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    try:
        import cudnn

        out["cudnn_frontend"] = str(getattr(cudnn, "__version__", "unknown"))
        out["cudnn_backend"] = int(cudnn.backend_version())
    except Exception as err:  # noqa: BLE001
        out["cudnn_error"] = f"{type(err).__name__}: {err}"
    return out


# ----- targets -----------------------------------------------------------------------------------
def target(part: str, item: str, figure: str, goal: str, met: bool | None, why: str = "") -> dict:
    return {"part": part, "item": item, "figure": figure, "target": goal, "met": met, "why": why}


def verdict(t: Mapping) -> str:
    if t.get("met") is None:
        return "n/a" + (f" ({t['why']})" if t.get("why") else "")
    return "met" if t["met"] else "MISSED"


def _impl(row: Mapping, name: str) -> Mapping:
    found = (row.get("impls") or {}).get(name)
    return found if isinstance(found, Mapping) else {}


def first_call_targets(rows: Sequence[Mapping]) -> list[dict]:
    goal = f"<= {common.fmt_num(FIRST_CALL_MS_MAX)} ms and 0 plan builds"
    out = []
    for row in rows:
        att = _impl(row, sa.ATTENTION)
        item = f"b{row.get('batch')} s{row.get('seqlen')}"
        ms, builds = att.get("first_ms"), att.get("plan_builds")
        if not isinstance(ms, (int, float)) or not isinstance(builds, int):
            out.append(target("A", item, "n/a", goal, None, att.get("status") or row.get("status") or "not measured"))
            continue
        if att.get("fallback_calls"):  # the figure is torch's, not the bucket plans'
            out.append(target("A", item, f"{common.fmt_num(ms)} ms, fell back to torch SDPA", goal, False))
            continue
        out.append(target("A", item, f"{common.fmt_num(ms)} ms, {builds} builds", goal,
                          ms <= FIRST_CALL_MS_MAX and builds == 0))
    return out


def steady_targets(rows: Sequence[Mapping]) -> list[dict]:
    """Per shape: forward+backward time against the dense graph's as timed with CUDA events (eager:
    the host's time shows where the GPU waits for it), and as the plans' own GPU time (kernels only)."""
    goal = f"time / dense <= {1 / DENSE_SPEED_MIN:.4f} (speed >= {DENSE_SPEED_MIN}x dense)"
    out = []
    for key, suffix in (("attention_over_dense", ""), ("attention_over_dense_kernels", " (GPU kernels)")):
        for row in rows:
            item = f"b{row.get('batch')} s{row.get('seqlen')}{suffix}"
            r = row.get(key)
            if not isinstance(r, (int, float)) or r <= 0:
                why = _impl(row, sa.RAW_DENSE).get("status") or _impl(row, sa.ATTENTION).get("status") \
                    or row.get("status") or "not measured"
                if why == common.RESULT_STATUS_OK:
                    why = _impl(row, sa.ATTENTION).get("kernel_status") or _impl(row, sa.RAW_DENSE).get(
                        "kernel_status") or "not measured"
                out.append(target("B", item, "n/a", goal, None, str(why)))
                continue
            if row.get("attention_fused") is False:
                out.append(target("B", item, f"{r:.3f}x time, fell back to torch SDPA", goal, False))
                continue
            out.append(target("B", item, f"{r:.3f}x time ({1 / r:.3f}x speed)", goal, r <= 1 / DENSE_SPEED_MIN))
    return out


def _run_of(runs: Sequence[Mapping], **match: Any) -> Mapping:
    for r in runs:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return {}


def generate_targets(models: Sequence[Mapping]) -> list[dict]:
    goal = f"fusedattn / flash tokens/s >= {GENERATE_VS_FLASH_MIN}"
    out = []
    for m in models:
        runs = m.get("runs") or []
        for cache in sorted({r.get("cache") for r in runs if r.get("cache")}, key=str):
            fa = _run_of(runs, cache=cache, impl=hf.FUSEDATTN)
            fl = _run_of(runs, cache=cache, impl=hf.SDPA_FLASH)
            item = f"{m.get('name')} {cache} cache"
            r = common.ratio(fa.get("tokens_per_s"), fl.get("tokens_per_s"))
            if r is None:
                why = "flash: " + str(fl.get("status")) if common.median_of(fl.get("tokens_per_s")) is None \
                    else "fusedattn: " + str(fa.get("status"))
                out.append(target("C", item, "n/a", goal, None, why))
                continue
            out.append(target("C", item, f"{r:.3f}x", goal, r >= GENERATE_VS_FLASH_MIN))
    return out


def finetune_targets(runs: Sequence[Mapping]) -> list[dict]:
    """Totals of the first pass (buckets built on the way) and of the second (buckets all built, as
    after `warmup` over the ladder), each against flash and torch's cuDNN."""
    out: list[dict] = []
    if not runs:
        return out
    fa = _run_of(runs, impl=hf.FUSEDATTN)
    for key, label in (("total_ms", ""), ("second_total_ms", " (second pass)")):
        for impl, limit in ((hf.SDPA_FLASH, FINETUNE_VS_FLASH_MAX), (hf.SDPA_CUDNN, FINETUNE_VS_CUDNN_MAX)):
            other = _run_of(runs, impl=impl)
            goal = f"fusedattn / {impl} total time <= {limit}"
            r = common.ratio(fa.get(key), other.get(key))
            item = f"total vs {impl}{label}"
            if r is None:
                status = key.replace("total_ms", "pass_status")
                why = str(other.get(status) or other.get("status")) if fa.get(key) is not None \
                    else "fusedattn: " + str(fa.get(status) or fa.get("status"))
                out.append(target("D", item, "n/a", goal, None, why))
                continue
            out.append(target("D", item, f"{r:.3f}x", goal, r <= limit))
    return out


def evaluate(parts: Mapping[str, Mapping]) -> list[dict]:
    """Every target of the section with its figure and whether it was met (None: not measured)."""
    def of(part: str, key: str) -> list:
        value = (parts.get(part) or {}).get(key)
        return value if isinstance(value, list) else []

    return (first_call_targets(of("first_call", "rows")) + steady_targets(of("steady", "rows"))
            + generate_targets(of("generate", "models")) + finetune_targets(of("finetune", "runs")))


# ----- report ------------------------------------------------------------------------------------
def _status_or(item: Mapping, text: Callable[[Mapping], str]) -> str:
    return text(item) if common.is_ok(item.get("status", common.RESULT_STATUS_OK)) else str(item.get("status"))


def _versions_line(parts: Mapping) -> str:
    v = next((p.get("versions") for p in parts.values() if isinstance(p, Mapping) and p.get("versions")), None)
    if not v:
        return ""
    tf = (parts.get("generate") or {}).get("transformers") or "n/a"
    return (f"Measured on {v.get('gpu', 'n/a')}: torch {v.get('torch')} (its cuDNN {v.get('torch_cudnn')}), "
            f"cuDNN backend {v.get('cudnn_backend', 'n/a')}, cudnn-frontend {v.get('cudnn_frontend', 'n/a')}, "
            f"transformers {tf}.")


def render_targets(targets: Sequence[Mapping]) -> str:
    if not targets:
        return ""
    met = sum(1 for t in targets if t.get("met") is True)
    missed = sum(1 for t in targets if t.get("met") is False)
    return (f"Targets: {met} met, {missed} MISSED, {len(targets) - met - missed} not measured.\n\n"
            + common.md_table(("part", "item", "figure", "target", "verdict"),
                       [(t.get("part"), t.get("item"), t.get("figure"), t.get("target"), verdict(t))
                        for t in targets]))


def render_first_call(p: Mapping) -> str:
    rows = []
    for row in p.get("rows") or []:
        label = f"b{row.get('batch')} s{row.get('seqlen')}"
        bucket = "x".join(str(x) for x in row.get("bucket") or []) or "?"
        if not row.get("impls"):
            rows.append((label, bucket, row.get("status", "n/a"), "", "", "", "", ""))
            continue
        att = _impl(row, sa.ATTENTION)
        rows.append((label, bucket,
                     _status_or(att, lambda a: f"{common.fmt_num(a.get('first_ms'))} "
                                f"(again {common.fmt_num(a.get('again_ms'))})"
                                + (" fell back" if a.get("fallback_calls") else "")),
                     att.get("plan_builds", ""), att.get("plan_loads", ""),
                     _status_or(_impl(row, sa.SDPA_CUDNN), lambda a: common.fmt_num(a.get("first_ms"))),
                     _status_or(_impl(row, sa.SDPA_FLASH), lambda a: common.fmt_num(a.get("first_ms"))),
                     (row.get("order") or ["?"])[0]))
    if not rows:
        return ""
    impls = p.get("impls") or {}
    notes = "; ".join(f"{n}: {i.get('note') or i.get('status')}" for n, i in impls.items()
                      if i.get("note") or not common.is_ok(i.get("status")))
    return (f"{p.get('problem', '')}; class warmed on b{'/s'.join(str(x) for x in p.get('warm_shape') or [])}."
            + (f" {notes}." if notes else "") + "\n\n"
            + common.md_table(("shape", "bucket (B x S)", "attention() first ms", "plan builds", "plan loads",
                        "cuDNN SDPA first ms", "flash first ms", "ran first"), rows))


def render_steady(p: Mapping) -> str:
    rows = []
    for row in p.get("rows") or []:
        label = f"b{row.get('batch')} s{row.get('seqlen')}"
        if not row.get("impls"):
            rows.append((label, "x".join(str(x) for x in row.get("bucket") or []), row.get("status", "n/a"),
                         "", "", "", "", "", "", "", "", "", ""))
            continue
        r = row.get("attention_over_dense")
        fell = " (fell back)" if row.get("attention_fused") is False else ""
        kernels = [common.fmt_num(_impl(row, n).get("kernel_ms")) for n in (sa.ATTENTION, sa.RAW_DENSE)]
        rows.append((label + fell, "x".join(str(x) for x in row.get("bucket") or []),
                     *(_status_or(_impl(row, n), lambda a: common.fmt_stat(a.get("fwd_bwd_ms")))
                       for n in (sa.ATTENTION, sa.RAW_DENSE, sa.SDPA_FLASH)),
                     common.fmt_ratio(r), common.fmt_ratio(1 / r if r else None),
                     common.fmt_ratio(row.get("attention_over_flash")), *kernels,
                     common.fmt_ratio(row.get("attention_over_dense_kernels")),
                     {True: "yes", False: "no"}.get(row.get("same_kernels"), "n/a"),
                     common.fmt_num(row.get("check_rel_err"))))
    if not rows:
        return ""
    return (f"{p.get('problem', '')}; forward+backward GPU ms:\n\n"
            + common.md_table(("shape", "bucket (B x S)", "attention()", "dense cuDNN graph", "torch flash",
                               "attention() / dense time", "attention() speed vs dense", "attention() / flash time",
                               "attention() kernels ms", "dense kernels ms", "kernels: attention() / dense",
                               "same kernels", "check"), rows))


def render_generate(p: Mapping) -> str:
    parts = []
    for m in p.get("models") or []:
        lines = [f"{m.get('model', m.get('name'))}" + ("" if common.is_ok(m.get("status", common.RESULT_STATUS_OK))
                                                         else f" — {m.get('status')}")]
        lg = m.get("logits") or {}
        if lg:
            lines.append(_status_or(lg, lambda g: (
                f"Logits over {g.get('tokens')} tokens, fusedattn vs sdpa: max abs diff "
                f"{common.fmt_num(g.get('max_abs_diff'))} (max |logit| {common.fmt_num(g.get('max_abs_logit'))}), "
                f"argmax agreement {common.fmt_num(100 * g['argmax_agreement'])}%")))
        runs = m.get("runs") or []
        rows = []
        for r in runs:
            flash = _run_of(runs, cache=r.get("cache"), impl=hf.SDPA_FLASH)
            calls = r.get("attention_calls") or {}
            rows.append((r.get("cache"), r.get("impl") + (f" ({r['note']})" if r.get("note") else ""),
                         _status_or(r, lambda x: common.fmt_stat(x.get("tokens_per_s"))),
                         common.fmt_ratio(common.ratio(r.get("tokens_per_s"), flash.get("tokens_per_s"))),
                         "/".join(str(calls.get(k, "")) for k in ("fused_calls", "fallback_calls", "plan_builds"))
                         if calls else "", common.fmt_num(r.get("first_tokens_per_s"))
                         + (" (" + "/".join(str(first.get(k, "")) for k in ("fused_calls", "fallback_calls",
                                                                              "plan_builds")) + ")"
                            if (first := r.get("first_attention_calls")) else "")))
        if rows:
            lines.append(common.md_table(("cache", "implementation", "tokens/s", "vs flash",
                                          "attention() fused/fallback calls, plan builds",
                                          "first generate() tokens/s (calls, builds)"), rows))
        parts.append("\n\n".join(lines))
    return "\n\n".join(parts)


def render_finetune(p: Mapping) -> str:
    runs = p.get("runs") or []
    if not runs:
        return ""
    fa = _run_of(runs, impl=hf.FUSEDATTN)
    rows = []
    for r in runs:
        calls = r.get("attention_calls") or {}
        second = r.get("second_attention_calls") or {}
        losses = r.get("losses") or []
        rows.append((r.get("impl") + (f" ({r['note']})" if r.get("note") else ""),
                     _status_or(r, lambda x: common.fmt_num(x.get("total_ms"))),
                     common.fmt_stat(r.get("per_step_ms")),
                     common.fmt_ratio(common.ratio(fa.get("total_ms"), r.get("total_ms"))),
                     common.fmt_num(losses[-1]) if losses else "",
                     "/".join(str(calls.get(k, "")) for k in ("fused_calls", "fallback_calls", "plan_builds"))
                     if calls else "",
                     common.fmt_num(r.get("second_total_ms")),
                     common.fmt_ratio(common.ratio(fa.get("second_total_ms"), r.get("second_total_ms"))),
                     "/".join(str(second.get(k, "")) for k in ("fused_calls", "fallback_calls", "plan_builds"))
                     if second else ""))
    return (f"{p.get('model', '')}; batch {p.get('batch')}, step lengths {p.get('step_lengths')} "
            f"(warm step at {p.get('warm_length')}), then a second pass at as many new lengths:\n\n"
            + common.md_table(("implementation", "total ms", "per-step ms", "fusedattn total / this",
                               "last loss", "attention() fused/fallback calls, plan builds",
                               "second pass total ms", "fusedattn / this (second pass)",
                               "second pass calls, builds"), rows))


RENDER_PARTS = {"first_call": render_first_call, "steady": render_steady, "generate": render_generate,
                "finetune": render_finetune}


def render(s: Mapping) -> str:
    parts = s.get("parts") or {}
    out = [x for x in (_versions_line(parts), render_targets(s.get("targets") or [])) if x]
    for name in PARTS:
        p = parts.get(name)
        if not isinstance(p, Mapping):
            continue
        body = RENDER_PARTS[name](p)
        status = "" if common.is_ok(p.get("status", common.RESULT_STATUS_OK)) else f"**{p.get('status')}**"
        out.append("\n\n".join(x for x in (f"### {PART_TITLES[name]}", status, body) if x))
    return "\n\n".join(out)
