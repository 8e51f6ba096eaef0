"""Section 5, FP8 part: attention(fp8=True) (quantization of q, k, v inside the call) vs bf16
attention(), for inference and for training."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tools.bench.common import (
    BACKWARD_FLOP_FACTOR,
    RESULT_STATUS_OK,
    config_flops,
    error_status,
    first_line,
    fmt_num,
    fmt_ratio,
    fmt_stat,
    in_turns,
    log,
    md_table,
    median_of,
    ratio,
    steady_plans,
    summarize,
    tflops,
)
from tools.bench.problems import attention_kwargs, dispatch_format, load_file
from tools.bench.tensors import cosine, cuda_times, kernel_profile, qkv, rel_err, to_bhsd

ROUNDS = 5  # rounds of the rows timed in turns (each `reps` calls per implementation)


@dataclass
class _Rows:
    """The measurement rows of the FP8 comparison, each timed with CUDA events."""

    torch: Any
    reps: int
    warm: int
    rows: list = field(default_factory=list)

    def add(self, name: str, fn: Callable, setup: Callable | None = None, work: float | None = None,
            base: dict | None = None) -> dict:
        row: dict[str, Any] = {"name": name}
        self.rows.append(row)
        try:
            row["ms"] = summarize(cuda_times(self.torch, fn, self.reps, self.warm, setup), "ms")
            row["tflops"] = tflops(work, median_of(row["ms"])) if work else None
            row["ratio_to_bf16"] = ratio(row["ms"], base["ms"]) if base and base.get("ms") else None
        except Exception as err:  # noqa: BLE001
            row["status"] = error_status(err)
            log(traceback.format_exc())
        return row

    def in_turns(self, calls: Sequence[tuple[str, Callable]], work: float) -> list[dict]:
        """Rows of calls timed in turns: ROUNDS rounds of `reps` calls each, the order rotating, so a
        GPU or host whose speed drifts during the run weighs on every call alike."""
        rows = [{"name": name} for name, _ in calls]
        self.rows.extend(rows)

        def timer(fn: Callable) -> Callable:
            return lambda first: {"ms": cuda_times(self.torch, fn, self.reps, self.warm if first else 2)}

        samples = in_turns([(name, timer(fn)) for name, fn in calls], ROUNDS)
        for row in rows:
            got = samples[row["name"]]
            if "error" in got:
                row["status"] = error_status(got["error"])
                log("".join(traceback.format_exception(got["error"])))
                continue
            row["ms"] = summarize(got["ms"], "ms")
            row["tflops"] = tflops(work, median_of(row["ms"]))
        return rows

    def kernels(self, name: str, fn: Callable, work: float, base: dict | None) -> dict:
        """A row of the GPU time of fn's kernels (torch.profiler; median of 3 profiles of 20 calls)."""
        row: dict[str, Any] = {"name": name}
        self.rows.append(row)
        try:
            row["ms"] = summarize([sum(kernel_profile(self.torch, fn, 20).values()) for _ in range(3)], "ms")
            row["tflops"] = tflops(work, median_of(row["ms"]))
            row["ratio_to_bf16"] = ratio(row["ms"], base["ms"]) if base and base.get("ms") else None
        except Exception as err:  # noqa: BLE001
            row["status"] = error_status(err)
            log(traceback.format_exc())
        return row


def measure(torch: Any, r: dict, args: Mapping) -> None:
    from fusedattn_select import select
    from fusedattn_select.runtime.api import config_from_tensors

    stem, name, *changes = args["fp8_entry"]  # (file, config[, AttnConfig changes])
    cfg = load_file(stem).get(name).config.replace(**(changes[0] if changes else {}))
    layout = dispatch_format(cfg.qkv_layout)
    flops = config_flops(cfg)
    changed = f" with {', '.join(f'{k}={v}' for k, v in changes[0].items())}" if changes else ""
    r["shape"] = f"{stem} {name}{changed}: {layout} b{cfg.batch_size} h{cfg.num_heads_q}/{cfg.num_heads_kv} " \
                 f"s{cfg.seqlen_q} d{cfg.head_dim_qk} {cfg.mask}"
    rows = _Rows(torch, int(args["reps"]), int(args["warmup"]))
    r["rows"] = rows.rows
    kwargs = attention_kwargs(cfg, layout)
    q, k, v = qkv(torch, cfg, layout, requires_grad=False)
    fp8_sel = select(config_from_tensors(q, k, v, fp8=True, is_training=False, **kwargs))
    r["fp8_inference_selection"] = fp8_sel.backend.value + (
        f": {first_line(fp8_sel.message)}" if fp8_sel.message else "")
    raws = _raw_runners(torch, rows, cfg)
    _inference(torch, r, rows, (q, k, v), kwargs, flops, raws)
    del raws
    torch.cuda.empty_cache()
    _training(torch, r, rows, (q, k, v), kwargs, flops)
    r["status"] = RESULT_STATUS_OK


def _inference(torch: Any, r: dict, rows: _Rows, tensors: tuple, kwargs: dict, flops: float,
               raws: Sequence[tuple[str, Callable]]) -> None:
    """The inference rows, with the raw graphs `raws` in the same turns."""
    from fusedattn_select.runtime.api import attention, dispatch_info
    from fusedattn_select.runtime.fp8 import FP8History

    q, k, v = tensors
    with torch.no_grad():
        before = dispatch_info()
        ref = attention(q, k, v, **kwargs)
        out8 = attention(q, k, v, fp8=True, **kwargs)
        torch.cuda.synchronize()
        after = dispatch_info()
        r["fp8_fallback_calls"] = after.get("fallback_calls", 0) - before.get("fallback_calls", 0)
        r["fp8_vs_bf16_rel_err"], r["fp8_vs_bf16_cosine"] = rel_err(out8, ref), cosine(out8, ref)
        r["bf16_plan"] = steady_plans(lambda: attention(q, k, v, **kwargs), q, k, v, False, **kwargs)  # its own plans
        # Delayed scaling: the scales come from the amax history of earlier calls (no amax pass).
        history = FP8History()
        attention(q, k, v, fp8=history, **kwargs)  # the first call scales from its own amax and records it
        delayed = attention(q, k, v, fp8=history, **kwargs)
        r["fp8_delayed_vs_bf16_rel_err"], r["fp8_delayed_vs_bf16_cosine"] = rel_err(delayed, ref), cosine(delayed, ref)
        # FP8 output (an FP8Tensor) for a caller whose next operation takes FP8: no conversion pass.
        history8 = FP8History(o_dtype=torch.float8_e4m3fn)
        r["fp8_output_vs_bf16_cosine"] = cosine(attention(q, k, v, fp8=history8, **kwargs).dequantize(ref.dtype), ref)
        # In turns: the GPU's clock drifts over a run (and drops after heavy kernels), and the ratios
        # compare these rows.
        base, *timed = rows.in_turns((
            ("bf16 attention() fwd (inference)", lambda _: attention(q, k, v, **kwargs)),
            ("fp8 attention(fp8=True) fwd incl. quantization (inference)",
             lambda _: attention(q, k, v, fp8=True, **kwargs)),
            ("fp8 attention(fp8=FP8History()) fwd incl. quantization, delayed scaling (inference)",
             lambda _: attention(q, k, v, fp8=history, **kwargs)),
            ("fp8 attention(fp8=FP8History(o_dtype=float8_e4m3fn)) fwd incl. quantization, delayed scaling, "
             "FP8 output (inference)", lambda _: attention(q, k, v, fp8=history8, **kwargs)), *raws), flops)
        for row in timed:
            row["ratio_to_bf16"] = ratio(row.get("ms"), base["ms"]) if base.get("ms") else None
        r["inference_in_turns"] = True
        for label, fp8 in (("current scaling", True), ("delayed scaling", history)):
            rows.kernels(f"GPU kernels of attention(fp8=...) fwd, {label} (the sum of its kernels' times: no host gaps)",
                         lambda _, fp8=fp8: attention(q, k, v, fp8=fp8, **kwargs), flops, base)
        qb, kb, vb = (to_bhsd(t, kwargs["layout"]) for t in (q, k, v))
        _quantize_rows(torch, rows, (qb, kb, vb), base)
    del out8


def _raw_runners(torch: Any, rows: _Rows, cfg: Any) -> list[tuple[str, Callable]]:
    """The raw cuDNN forward graphs, bf16 and FP8 (FP8 in and out, unit scales, no quantization),
    as (row name, runner): the floors of the two attention() calls, timed with them. A graph that
    cannot be built gets its row with the reason."""
    from fusedattn_select.types import Backend, Phase
    from tools.bench.raw_graph import fp8_graph_config, graph_runner

    inference = cfg.replace(is_training=False)
    runners = []
    for label, graph_cfg, backend in (
            ("bf16", inference, Backend.F16),
            ("FP8 (e4m3 q, k, v, O; no quantization)", fp8_graph_config(inference), Backend.FP8)):
        name = f"raw cuDNN {label} forward graph"
        try:
            run = graph_runner(torch, graph_cfg, backend, Phase.FORWARD)
        except Exception as err:  # noqa: BLE001
            rows.rows.append({"name": name, "status": error_status(err)})
            continue
        runners.append((name, lambda _, run=run: run()))
    return runners


def _quantize_rows(torch: Any, rows: _Rows, tensors: tuple, base: dict) -> None:
    """quantize_qkv (current and delayed scaling) and O's dequantization, per kernel implementation."""
    from fusedattn_select.runtime import fp8_kernels
    from fusedattn_select.runtime.fp8 import FP8History, dequantize, quantize_qkv
    from fusedattn_select.runtime.run_settings import run_settings

    qb, kb, vb = tensors
    e4m3 = torch.float8_e4m3fn
    o8 = torch.empty_like(qb, dtype=e4m3).copy_(qb.clamp(-448, 448))  # an O-sized fp8 tensor, q's layout
    descale = torch.ones(1, device=qb.device)
    try:
        for impl in ("triton", "torch"):
            if impl == "triton" and fp8_kernels._load_triton() is not None:
                continue
            run_settings.replace(fp8_kernels=impl)
            fp8_kernels.backend(refresh=True)
            rows.add(f"quantize_qkv, current scaling ({impl}: amax + scale + cast of q, k, v)",
                     lambda _: quantize_qkv(qb, kb, vb, e4m3), base=base)
            hist = FP8History()
            quantize_qkv(qb, kb, vb, e4m3, history=hist)
            rows.add(f"quantize_qkv, delayed scaling ({impl}: cast of q, k, v + amax history)",
                     lambda _, hist=hist: quantize_qkv(qb, kb, vb, e4m3, history=hist), base=base)
            rows.add(f"dequantize of O ({impl}: fp8 -> {qb.dtype})".replace("torch.", ""),
                     lambda _: dequantize(o8, descale, qb.dtype), base=base)
    finally:
        run_settings.reread()  # back to the environment's choice
        fp8_kernels.backend(refresh=True)


def _training(torch: Any, r: dict, rows: _Rows, tensors: tuple, kwargs: dict, flops: float) -> None:
    """Forward + backward: bf16, FP8 with current scaling and FP8 with delayed scaling, timed in turns
    (ROUNDS rounds, the order rotating), then the GPU time of each step's kernels."""
    from fusedattn_select import select
    from fusedattn_select.runtime.api import attention, config_from_tensors, dispatch_info
    from fusedattn_select.runtime.fp8 import FP8History

    qg, kg, vg = (t.detach().requires_grad_(True) for t in tensors)
    grads_of = (qg, kg, vg)
    train_sel = select(config_from_tensors(qg, kg, vg, fp8=True, is_training=True, **kwargs))
    r["fp8_training_selection"] = train_sel.backend.value + (
        f": {first_line(train_sel.message)}" if train_sel.message else "")
    grad = torch.randn_like(attention(qg, kg, vg, **kwargs))
    r["bf16_training_plan"] = steady_plans(
        lambda: torch.autograd.grad(attention(qg, kg, vg, **kwargs), grads_of, grad), qg, kg, vg, True, **kwargs)
    before = dispatch_info()
    torch.autograd.grad(attention(qg, kg, vg, fp8=True, **kwargs), grads_of, grad)
    torch.cuda.synchronize()
    r["fp8_training_fallback_calls"] = dispatch_info().get("fallback_calls", 0) - before.get("fallback_calls", 0)
    history = FP8History()  # steady-state training: scales from the amaxes the earlier steps recorded

    def step(fp8: Any) -> Callable:
        if fp8 is None:
            return lambda _: torch.autograd.grad(attention(qg, kg, vg, **kwargs), grads_of, grad)
        return lambda _: torch.autograd.grad(attention(qg, kg, vg, fp8=fp8, **kwargs), grads_of, grad)

    work = flops * (1 + BACKWARD_FLOP_FACTOR)
    steps = (("bf16 attention() fwd+bwd (training)", step(None)),
             ("fp8 attention(fp8=True) fwd+bwd incl. quantization (training)", step(True)),
             ("fp8 attention(fp8=FP8History()) fwd+bwd incl. quantization, delayed scaling (training)",
              step(history)))
    timed = rows.in_turns(steps, work)
    for row in timed[1:]:
        row["ratio_to_bf16"] = ratio(row.get("ms"), timed[0].get("ms")) if timed[0].get("ms") else None
    base = None  # the kernels of the bf16 step, which the FP8 steps' kernels are compared with
    for label, fn in steps:
        row = rows.kernels(f"GPU kernels of {label.split(' (')[0]} (the sum of its kernels' times: no host gaps)",
                           fn, work, base)
        base = base or row


def _cos(x: Any) -> str:
    return f"{x:.5f}" if isinstance(x, float) else "n/a"


_TURNS = (" The four `attention()` inference rows with the two raw graphs, and the three training rows, are "
          f"each timed in turns ({ROUNDS} rounds, the order rotating); the other rows one after another.")


def render(fp8: Mapping) -> str:
    if fp8.get("rows"):
        return (f"FP8 ({fp8.get('shape', '')}): `attention(fp8=True)` (quantization of q, k, v "
                f"inside the call) vs bf16 `attention()`.{_TURNS if fp8.get('inference_in_turns') else ''}"
                "\n\n" + md_table(
                    ("measurement", "ms", "TFLOPS", "ratio to bf16"),
                    [(r.get("name"), fmt_stat(r.get("ms")) if r.get("ms") else r.get("status", "n/a"),
                      fmt_num(r.get("tflops")), fmt_ratio(r.get("ratio_to_bf16")))
                     for r in fp8["rows"]])
                + "\n\nOutput against bf16 `attention()`: current scaling relative error "
                f"{fmt_num(fp8.get('fp8_vs_bf16_rel_err'))}, cosine {_cos(fp8.get('fp8_vs_bf16_cosine'))}; "
                f"delayed scaling relative error {fmt_num(fp8.get('fp8_delayed_vs_bf16_rel_err'))}, cosine "
                f"{_cos(fp8.get('fp8_delayed_vs_bf16_cosine'))}; FP8 output (dequantized) cosine "
                f"{_cos(fp8.get('fp8_output_vs_bf16_cosine'))}.")
    if fp8.get("status"):
        return f"FP8: {fp8.get('status')}"
    return ""
