"""Section 1, selection latency: get_backend() on a cached config vs torch's own checks."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from tools.bench.common import (Partial, first_line, fmt_ratio, fmt_stat, md_table, ratio, summarize, time_calls, timed,
                                warmed_selector)
from tools.bench.problems import load_file
from tools.bench.runner import Runner


# ----- parent ------------------------------------------------------------------------------------
def run(runner: Runner) -> dict:
    return runner.worker_section("selection", {"file": "llama-3-8b", "entry": "train-bf16",
                                               "calls": runner.plan["selection_calls"],
                                               "batches": runner.plan["selection_batches"]}, "selection", [
        "get_backend runs the process-wide selector: rules, then the memory cache (this config was "
        "probed once before the timed calls). torch's two calls see the same shape as CUDA tensors "
        "that require grad.",
    ])


# ----- worker ------------------------------------------------------------------------------------
def worker(args: Mapping, res: Partial) -> None:
    import fusedattn_select as fas

    cfg = load_file(args["file"]).get(args["entry"]).config
    calls, batches = int(args["calls"]), int(args["batches"])
    res.update(problem=f"{args['file']} {args['entry']} (b{cfg.batch_size} h{cfg.num_heads_q}/{cfg.num_heads_kv} "
                       f"s{cfg.seqlen_q} d{cfg.head_dim_qk} {cfg.qkv_dtype} {cfg.mask} train)",
               calls=calls, batches=batches, rows=[])
    rows = res["rows"]

    def add(name: str, fn: Callable[[], Any], answer: Any = "") -> None:
        try:
            rows.append({"name": name, "us": summarize(time_calls(fn, calls, batches), "us"), "answer": str(answer)})
        except Exception as err:  # noqa: BLE001
            rows.append({"name": name, "status": f"n/a: {type(err).__name__}: {first_line(err)}"})
        res.save()

    selector = warmed_selector()
    res["engine"] = selector.engine_name
    if selector.engine is None:
        res["engine_unavailable"] = selector.unavailable_reason
    first, first_ms = timed(lambda: fas.get_backend(cfg))
    res["first_call_ms"] = first_ms
    add("get_backend(cfg)", lambda: fas.get_backend(cfg), f"{first[0].value} (first call {first_ms:.1f} ms, probed)")
    add("cfg.cache_key() (part of every select)", cfg.cache_key)
    add("empty Python call (loop overhead)", lambda: None)
    _torch_checks(cfg, add, rows)
    res["cache_info"] = fas.cache_info()


def _torch_checks(cfg: Any, add: Callable[..., None], rows: list) -> None:
    """torch's fused-SDPA choice and its cuDNN check on the same shape, timed by `add`."""
    import torch

    from fusedattn_select.dtypes import torch_dtype

    dev = torch.device("cuda")
    dtype = torch_dtype(cfg.qkv_dtype, torch)
    b, hq, hk, s, skv, d = (cfg.batch_size, cfg.num_heads_q, cfg.num_heads_kv, cfg.seqlen_q, cfg.seqlen_kv,
                            cfg.head_dim_qk)
    q = torch.randn(b, hq, s, d, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(b, hk, skv, d, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(b, hk, skv, cfg.resolved_head_dim_v, device=dev, dtype=dtype, requires_grad=True)
    causal, gqa = cfg.is_causal, hq != hk
    try:
        from torch.nn.attention import SDPBackend

        names = {int(m): n for n, m in SDPBackend.__members__.items()}
    except Exception:  # noqa: BLE001
        names = {}
    try:
        choice = torch._fused_sdp_choice(q, k, v, None, 0.0, causal, scale=None, enable_gqa=gqa)
        add("torch._fused_sdp_choice(q, k, v, ...)",
            lambda: torch._fused_sdp_choice(q, k, v, None, 0.0, causal, scale=None, enable_gqa=gqa),
            names.get(int(choice), choice))
    except Exception as err:  # noqa: BLE001
        rows.append({"name": "torch._fused_sdp_choice(q, k, v, ...)",
                     "status": f"n/a: {type(err).__name__}: {first_line(err)}"})
    try:
        from torch.backends.cuda import SDPAParams, can_use_cudnn_attention

        params = SDPAParams(q, k, v, None, 0.0, causal, gqa)
        answer = can_use_cudnn_attention(params, False)
        add("can_use_cudnn_attention(params)", lambda: can_use_cudnn_attention(params, False), answer)
        add("SDPAParams(...) + can_use_cudnn_attention",
            lambda: can_use_cudnn_attention(SDPAParams(q, k, v, None, 0.0, causal, gqa), False), answer)
    except Exception as err:  # noqa: BLE001
        rows.append({"name": "can_use_cudnn_attention(SDPAParams(...))",
                     "status": f"n/a: {type(err).__name__}: {first_line(err)}"})


# ----- report ------------------------------------------------------------------------------------
def render(s: Mapping) -> str:
    rows = s.get("rows") or []
    if not rows:
        return ""
    lines = [f"Problem: {s.get('problem', '?')}; engine {s.get('engine', '?')}; {s.get('calls', '?')} calls in "
             f"{s.get('batches', '?')} timed batches per row (µs per call).", ""]
    if s.get("engine_unavailable"):
        lines[0] += f" No probing engine: {s['engine_unavailable']}."
    table = []
    base = next((r.get("us") for r in rows if r.get("name") == "get_backend(cfg)"), None)
    for r in rows:
        value = fmt_stat(r.get("us")) if r.get("us") else (r.get("status") or "n/a")
        table.append((r.get("name"), value, fmt_ratio(ratio(r.get("us"), base)) if r.get("us") else "n/a",
                      r.get("answer", "")))
    lines.append(md_table(("call", "µs per call", "ratio to get_backend", "answer"), table))
    return "\n".join(lines)
