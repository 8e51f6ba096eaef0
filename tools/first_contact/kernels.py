"""Worker side of the parts that call attention alone: first calls (rows 1 and 4), Llama-3-8B's
shape warm against the raw cuDNN graph (row 5), and a fresh process's first training step (row 6).

Each function runs in its own fresh process, imports torch itself (rows 1 and 6 time the imports)
and returns a JSON-able dict.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Mapping
from typing import Any

from tools.first_contact.sides import attention_call, device, sync, timed_ms


def first_calls(side: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """Rows 1 and 4: fwd+bwd at each shape (the first call and again; the second shape lies in an
    unbuilt bucket), then a tiny forward: its first call and the medians of calls 2-101 and 1001-1100."""
    started = time.perf_counter()
    import torch

    call = attention_call(torch, side)
    result: dict[str, Any] = {"import_ms": (time.perf_counter() - started) * 1e3}
    result["device_init_ms"] = timed_ms(torch, lambda: torch.zeros(1, device=device()))
    torch.manual_seed(0)
    heads_q, heads_kv, head_dim = args["heads"]
    steps = []
    for batch, seqlen in args["shapes"]:
        options = {"device": device(), "dtype": torch.bfloat16, "requires_grad": True}
        q = torch.randn(batch, seqlen, heads_q, head_dim, **options)
        k, v = (torch.randn(batch, seqlen, heads_kv, head_dim, **options) for _ in range(2))
        grad = torch.randn_like(q)
        def fwd_bwd(q: Any = q, k: Any = k, v: Any = v, grad: Any = grad) -> Any:
            return torch.autograd.grad(call(q, k, v, True), (q, k, v), grad)

        for repeat in ("first", "again"):
            ms = timed_ms(torch, fwd_bwd)
            steps.append({"shape": f"b{batch} s{seqlen} h{heads_q}/{heads_kv} d{head_dim} causal bf16 fwd+bwd",
                          "call": repeat, "ms": ms})
    result["steps"] = steps
    b, s, h, d = args["tiny"]
    q, k, v = (torch.randn(b, s, h, d, device=device(), dtype=torch.bfloat16) for _ in range(3))
    tiny = [timed_ms(torch, lambda: call(q, k, v, False)) * 1e3 for _ in range(int(args["tiny_calls"]))]
    result["tiny_us"] = {"shape": f"b{b} s{s} h{h} d{d} bf16 fwd", "first": tiny[0],
                         "calls_2_101_median": statistics.median(tiny[1:101]),
                         "calls_1001_1100_median": statistics.median(tiny[1000:1100])}
    return result


def first_step(side: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """Row 6: one training step of a block around attention (q/k/v/o projections, causal attention,
    SGD) in a process that has imported nothing yet; `first_result_at` (time.time()) is when its
    loss is on the host, which the parent measures from the process's start."""
    started = time.perf_counter()
    import torch

    call = attention_call(torch, side)
    result: dict[str, Any] = {"import_ms": (time.perf_counter() - started) * 1e3}
    batch, seqlen, heads_q, heads_kv, head_dim = args["shape"]
    hidden, kv_width = heads_q * head_dim, heads_kv * head_dim
    torch.manual_seed(0)
    layers = torch.nn.ModuleDict({name: torch.nn.Linear(hidden, width, bias=False) for name, width in
                                  (("q", hidden), ("k", kv_width), ("v", kv_width), ("o", hidden))})
    layers.to(device=device(), dtype=torch.bfloat16)
    optimizer = torch.optim.SGD(layers.parameters(), lr=1e-3)
    x = torch.randn(batch, seqlen, hidden, device=device(), dtype=torch.bfloat16)

    def step() -> float:
        q = layers["q"](x).view(batch, seqlen, heads_q, head_dim)
        k, v = (layers[n](x).view(batch, seqlen, heads_kv, head_dim) for n in ("k", "v"))
        out = call(q, k, v, True).reshape(batch, seqlen, hidden)
        loss = layers["o"](out).float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())  # on the host: the step's result

    result["setup_ms"] = (time.perf_counter() - started) * 1e3 - result["import_ms"]
    step_started = time.perf_counter()
    result["first_loss"] = step()
    result["first_result_at"] = time.time()
    result["first_step_ms"] = (time.perf_counter() - step_started) * 1e3
    result["in_process_ms"] = (time.perf_counter() - started) * 1e3
    result["second_step_ms"] = timed_ms(torch, step)
    result["shape"] = f"b{batch} s{seqlen} h{heads_q}/{heads_kv} d{head_dim} causal bf16"
    return result


def big_shape(side: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """Row 5: fwd+bwd at Llama-3-8B's attention shape, warm (attention() on its own plans), timed with
    CUDA events in turns: attention() vs the raw cudnn-frontend graphs vs torch SDPA flash."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fusedattn_select import attention
    from tools.bench.common import in_turns, summarize
    from tools.bench.tensors import cuda_times, rel_err, to_bhsd

    batch, seqlen, heads_q, heads_kv, head_dim = args["shape"]
    torch.manual_seed(0)
    q = torch.randn(batch, seqlen, heads_q, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(batch, seqlen, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    grad, tensors, kwargs = torch.randn_like(q), (q, k, v), {"layout": "bshd", "mask": "causal"}
    result: dict[str, Any] = {"shape": f"b{batch} s{seqlen} h{heads_q}/{heads_kv} d{head_dim} causal bf16 fwd+bwd"}
    result["ours_plan"] = _steady(torch, lambda: torch.autograd.grad(attention(q, k, v, **kwargs), tensors, grad),
                                  tensors, kwargs)
    raw_fwd, raw_bwd = _raw_graphs(torch, tensors, kwargs)
    raw_fwd()
    sync(torch)
    ours_out = to_bhsd(attention(q, k, v, **kwargs).detach(), "bshd")
    result["raw_vs_ours_fwd_rel_err"] = rel_err(raw_fwd.tensors["o"], ours_out)
    bhsd = tuple(to_bhsd(t.detach(), "bshd").requires_grad_() for t in tensors)
    grad_bhsd = to_bhsd(grad, "bshd")
    functional = torch.nn.functional
    impls = {
        "ours": (lambda _: torch.autograd.grad(attention(q, k, v, **kwargs), tensors, grad), None),
        "raw": (lambda _: (raw_fwd(), raw_bwd()), None),
        "flash": (lambda _: torch.autograd.grad(functional.scaled_dot_product_attention(
            *bhsd, is_causal=True, enable_gqa=heads_q != heads_kv), bhsd, grad_bhsd), SDPBackend.FLASH_ATTENTION),
    }
    reps = int(args["reps"])

    def timer(fn: Any, backend: Any) -> Any:
        def run(first: bool) -> dict[str, list[float]]:
            with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
                return {"ms": cuda_times(torch, fn, reps, 3 if first else 1)}
        return run

    got = in_turns([(name, timer(fn, backend)) for name, (fn, backend) in impls.items()], int(args["rounds"]))
    result["impls"] = {name: ({"status": f"failed: {type(found['error']).__name__}: {found['error']}"}
                              if "error" in found else {"status": "ok", "ms": summarize(found["ms"], "ms")})
                       for name, found in got.items()}
    return result


def _steady(torch: Any, call: Any, tensors: tuple, kwargs: Mapping[str, Any]) -> str:
    """Call until attention() runs this shape's own plans (tools/bench/common.steady_plans); where that
    helper no longer fits the runtime's internals, 50 calls and the worker's pending builds instead."""
    from tools.bench.common import promotions_done, steady_plans

    try:
        return steady_plans(call, *tensors, True, timeout_s=60.0, **kwargs)
    except Exception as err:  # noqa: BLE001 - the runtime moved under the bench helper: warm by count
        for _ in range(50):
            call()
        try:
            promotions_done(60.0)
        except Exception:  # noqa: BLE001, S110 - nothing to wait for where the helper does not fit either
            pass
        for _ in range(10):
            call()
        sync(torch)
        return f"unknown (steady_plans failed: {type(err).__name__}: {err}; warmed by 60 calls)"


def _raw_graphs(torch: Any, tensors: tuple, kwargs: Mapping[str, Any]) -> tuple[Any, Any]:
    """The raw forward and backward cudnn-frontend graphs of this call (tools/bench/raw_graph)."""
    from fusedattn_select.runtime.api import config_from_tensors
    from fusedattn_select.types import Phase
    from tools.bench.raw_graph import RawGraph
    from tools.bench.tensors import to_bhsd

    cfg = config_from_tensors(*tensors, is_training=True, **kwargs)
    qb, kb, vb = (to_bhsd(t, "bshd") for t in tensors)
    forward = RawGraph(torch, cfg, Phase.FORWARD, {"q": qb, "k": kb, "v": vb}, kernel_cache=False)
    grad_out = torch.empty_like(forward.tensors["o"]).normal_()
    backward = RawGraph(torch, cfg, Phase.BACKWARD, {"q": qb, "k": kb, "v": vb, "o": forward.tensors["o"],
                                                     "stats": forward.tensors["stats"], "dO": grad_out},
                        kernel_cache=False)
    return forward, backward
