"""Section 5, dispatch: forward, backward and forward+backward time and TFLOPS of attention() vs raw
cuDNN graph execution vs torch SDPA backends on training problems of the model files. The section
also holds the FP8 comparison (fp8) and the per-call time on a tiny problem (host_overhead)."""

from __future__ import annotations

import contextlib
import re
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tools.bench import common, fp8, host_overhead
from tools.bench.problems import attention_kwargs, dispatch_format, load_file, pick_dispatch_entries
from tools.bench.raw_graph import RawGraph
from tools.bench.runner import Runner
from tools.bench.tensors import cuda_times, from_layout, qkv, rel_err, to_bhsd

SDPA_BACKENDS = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")
# The FP8 comparisons' result keys, one per entry of the worker's "fp8_entries".
FP8_KEYS = ("fp8", "fp8_2", "fp8_3")
# llama-3-8b's heads at s8192 and s4096: its bshd and sbhd training configs, and the bshd one at s4096
# (b2: the shape of the raw-graph anchor).
FP8_ENTRIES = (("llama-3-8b", "train-bf16"), ("llama-3-8b", "train-bf16-sbhd"),
               ("llama-3-8b", "train-bf16", {"seqlen_q": 4096, "seqlen_kv": 4096}))

_NOTES = [
    "TFLOPS from nominal FLOPs: fwd 4*B*H*Sq*Skv*D (2*B*H*Sq*Skv*(Dqk+Dv) when they differ), halved "
    "for causal; bwd = 2.5x fwd. Sliding windows are counted as plain causal (nominal).",
    "raw cuDNN graph = probing.cudnn.build_graph(depth=FULL) executed directly with preallocated "
    "tensors: static (as attention() builds its plans), and in full mode also with dynamic shapes "
    "from this thread's kernel cache, for the first shape of each problem class only (where cuDNN "
    "rejects dynamic shapes, e.g. the Hopper backward, that graph is static too: see the note). A "
    "kernel-cache graph for a second shape of a class gave wrong outputs and once an illegal memory "
    "access in an earlier run of this benchmark; section 6 checks that case. check = relative "
    "error of the forward outputs.",
]


# ----- parent ------------------------------------------------------------------------------------
def run(runner: Runner) -> dict:
    plan = runner.plan
    entries = []
    for stem in plan["dispatch_files"]:
        try:
            cf = load_file(stem)
        except Exception as err:  # noqa: BLE001 -- e.g. pyyaml missing: name it and go on
            runner.notes.append(f"dispatch: cannot read configs/{stem}.yaml: {err}")
            continue
        entries += [(stem, e.name) for e in pick_dispatch_entries(cf.entries, plan["dispatch_per_file"])]
    res = runner.worker("dispatch", {
        "entries": entries, "reps": plan["dispatch_reps"], "warmup": plan["dispatch_warmup"],
        "raw_dynamic": plan["raw_dynamic"], "fp8_entries": FP8_ENTRIES,
        "tiny_calls": plan["tiny_calls"], "tiny_batches": plan["tiny_batches"],
    }, "dispatch")
    if common.is_ok(res.get("status")):
        parts = [dict(c, key=f"{c.get('file')} {c.get('name')}") for c in res.get("configs") or []]
        parts += [dict(res.get(k) or {"status": common.failed("not measured")}, key=k)
                  for k in (*FP8_KEYS, "tiny")]
        res["status"] = common.combined_status(parts, key="key")
    elif res.get("configs") and not str(res.get("status", "")).startswith("partial"):
        res["status"] = "partial: " + str(res.get("status"))
    res["notes"] = [
        f"CUDA-event times of {plan['dispatch_reps']} repetitions after {plan['dispatch_warmup']} "
        f"warm-up calls, in {min(ROUNDS, plan['dispatch_reps'])} rounds with the implementations of a config "
        "in turns (the order rotating), so a host busy for a while weighs on all alike; inputs "
        "normal(0, 1). bwd = the backward call alone (forward run untimed before it); fwd+bwd = both, "
        "as one training step sees them. attention() and SDPA include autograd.",
        *_NOTES,
    ]
    return res


def sdpa_blocker(mask: str, window_size: Sequence[int], seqlen_q: int, seqlen_kv: int) -> str:
    """Why torch SDPA cannot compute this masking exactly ("" when it can, as causal or none)."""
    left, right = int(window_size[0]), int(window_size[1])
    if left == -1 and right in (-1, 0 if mask == "causal" else -1):
        return ""
    if mask == "causal" and right in (0, -1) and left >= seqlen_kv - 1:
        return ""  # the window never cuts at this length: plain causal
    return f"window_size=({left}, {right}) (torch SDPA has no sliding window)"


_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?")


def sdpa_reason(error_text: str, warning_texts: Sequence[str]) -> str:
    """The specific reasons in torch's "kernel not used because" warnings, without source locations."""
    reasons: list[str] = []
    for text in warning_texts:
        line = " ".join(_TRIGGERED.sub("", str(text)).split())
        if not line or line.endswith("because:") or line in reasons:
            continue
        reasons.append(line if len(line) <= 200 else line[:197] + "...")
    return "n/a: " + ("; ".join(reasons[:2]) or common.first_line(_TRIGGERED.sub("", error_text), 200))


# ----- worker ------------------------------------------------------------------------------------
def worker(args: Mapping, res: common.Partial) -> None:
    import torch
    import torch.nn.functional as F

    from fusedattn_select.runtime.api import dispatch_info

    deadline = args.get("deadline")
    # The short measurements first, so a tight budget trims configs, not them.
    res["tiny"] = {}
    try:
        host_overhead.measure(torch, F, res["tiny"], args)
    except Exception as err:  # noqa: BLE001
        res["tiny"]["status"] = common.error_status(err)
        common.log(traceback.format_exc())
    res.save()
    for key, entry in zip(FP8_KEYS, args["fp8_entries"]):
        res[key] = {}
        try:
            fp8.measure(torch, res[key], dict(args, fp8_entry=entry))
        except Exception as err:  # noqa: BLE001
            res[key]["status"] = common.error_status(err)
            common.log(traceback.format_exc())
        common.settle(torch, key)
        res.save()
    res["configs"] = []
    for stem, name in args["entries"]:
        c: dict[str, Any] = {"file": stem, "name": name, "impls": []}
        res["configs"].append(c)
        if res.skipped_past(c, deadline, 8):
            continue
        try:
            _measure_config(torch, F, c, load_file(stem).get(name).config, args, res)
            c.setdefault("status", common.RESULT_STATUS_OK)
        except Exception as err:  # noqa: BLE001
            c["status"] = common.error_status(err)
            common.log(traceback.format_exc())
        common.settle(torch, f"{stem} {name}")
        res.save()
    res["dispatch_info"] = dispatch_info()


# Section 5 times its implementations in this many rounds, taken in turns (common.in_turns).
ROUNDS = 5


@dataclass
class _Case:
    """One training config under measurement: its tensors, attention() arguments and result row."""

    torch: Any
    row: dict
    res: common.Partial
    cfg: Any
    layout: str
    tensors: tuple
    kwargs: dict
    fwd_flops: float
    reps: int
    warm: int
    deadline: float | None
    timers: list = field(default_factory=list)

    def record(self, name: str, fwd: Callable, setup_bwd: Callable | None, bwd: Callable, fwd_bwd: Callable,
               note: str = "", context: Callable[[], Any] = contextlib.nullcontext) -> dict:
        """A new entry of the row's impls, whose fwd, bwd and fwd+bwd `measure` times (each call
        inside `context()`)."""
        impl: dict[str, Any] = {"name": name}
        if note:
            impl["note"] = note
        self.row["impls"].append(impl)
        rounds = min(ROUNDS, self.reps)
        reps = -(-self.reps // rounds)

        def timer(first: bool) -> dict[str, list[float]]:
            warm = self.warm if first else 1
            with context():
                return {"fwd_ms": cuda_times(self.torch, fwd, reps, warm),
                        "bwd_ms": cuda_times(self.torch, bwd, reps, warm, setup_bwd),
                        "fwd_bwd_ms": cuda_times(self.torch, fwd_bwd, reps, warm)}

        self.timers.append((impl, timer))
        return impl

    def measure(self) -> None:
        """Time every recorded implementation, in turns (ROUNDS rounds), into its impls entry."""
        rounds = min(ROUNDS, self.reps)
        by_name = common.in_turns([(str(id(impl)), timer) for impl, timer in self.timers], rounds)
        for impl, _ in self.timers:
            got = by_name[str(id(impl))]
            if "error" in got:
                impl["status"] = common.error_status(got["error"])
                continue
            for quantity in ("fwd_ms", "bwd_ms", "fwd_bwd_ms"):
                impl[quantity] = common.summarize(got[quantity], "ms")
            factors = {"fwd": 1, "bwd": common.BACKWARD_FLOP_FACTOR, "fwd_bwd": 1 + common.BACKWARD_FLOP_FACTOR}
            for part, factor in factors.items():
                impl[f"{part}_tflops"] = common.tflops(self.fwd_flops * factor, common.median_of(impl[f"{part}_ms"]))
            impl["status"] = common.RESULT_STATUS_OK
        self.timers.clear()
        self.res.save()


def _shape_text(cfg: Any, layout: str) -> str:
    return (f"{layout} b{cfg.batch_size} h{cfg.num_heads_q}/{cfg.num_heads_kv} s{cfg.seqlen_q}"
            f"{'' if cfg.seqlen_kv == cfg.seqlen_q else '/' + str(cfg.seqlen_kv)} d{cfg.head_dim_qk}"
            f"{'' if cfg.resolved_head_dim_v == cfg.head_dim_qk else '/' + str(cfg.resolved_head_dim_v)} "
            f"{cfg.qkv_dtype} {cfg.mask}"
            f"{'' if tuple(cfg.window_size) == (-1, -1) else ' window ' + str(tuple(cfg.window_size))}")


def _measure_config(torch: Any, F: Any, c: dict, cfg: Any, args: Mapping, res: common.Partial) -> None:
    """attention(), raw cuDNN graphs and each torch SDPA backend on one training config."""
    layout = dispatch_format(cfg.qkv_layout)
    fwd_flops = common.config_flops(cfg)
    c["shape"] = _shape_text(cfg, layout)
    c["fwd_tflop"] = fwd_flops / 1e12
    case = _Case(torch, c, res, cfg, layout, qkv(torch, cfg, layout, requires_grad=True),
                 attention_kwargs(cfg, layout), fwd_flops, int(args["reps"]), int(args["warmup"]),
                 args.get("deadline"))
    out_att, grad = _measure_attention(case)
    checks: list[str] = []
    _measure_raw_graphs(case, out_att, checks, bool(args.get("raw_dynamic")))
    _measure_sdpa(case, F, out_att, grad, checks)
    case.measure()
    c["check"] = "; ".join(checks)


def _measure_attention(case: _Case) -> tuple[Any, Any]:
    """The library's dispatch (autograd Function around cached plans); its output and the gradient
    every implementation is given."""
    from fusedattn_select import select
    from fusedattn_select.runtime.api import attention, config_from_tensors, dispatch_info

    torch, c, kwargs = case.torch, case.row, case.kwargs
    q, k, v = tensors = case.tensors
    before = dispatch_info()
    out_att = attention(q, k, v, **kwargs)
    grad = torch.randn_like(out_att)
    torch.autograd.grad(out_att, tensors, grad)
    torch.cuda.synchronize()
    after = dispatch_info()
    fused = after.get("fallback_calls", 0) == before.get("fallback_calls", 0)
    c["attention_fused"] = fused
    c["attention_plan_builds"] = after.get("plan_builds", 0) - before.get("plan_builds", 0)
    note = ""
    if not fused:
        sel = select(config_from_tensors(q, k, v, **kwargs))
        note = f"fell back: {common.first_line(sel.message, 160)}"
    # A shape called again and again runs its own plans after `dense_after` calls: get there first,
    # so the timed calls measure the steady state (the first calls are section 7's subject).
    c["attention_plan"] = common.steady_plans(lambda: torch.autograd.grad(attention(q, k, v, **kwargs), tensors, grad),
                                               q, k, v, True, **kwargs)
    case.record("attention()",
                lambda _: attention(q, k, v, **kwargs),
                lambda: attention(q, k, v, **kwargs),
                lambda out: torch.autograd.grad(out, tensors, grad),
                lambda _: torch.autograd.grad(attention(q, k, v, **kwargs), tensors, grad), note)
    return out_att, grad


_DYNAMIC_CLASSES: set = set()


def _measure_raw_graphs(case: _Case, out_att: Any, checks: list[str], raw_dynamic: bool) -> None:
    """Raw cudnn-frontend graphs built at FULL: static, and (first shape of a class) dynamic."""
    from fusedattn_select.runtime.api import config_from_tensors
    from fusedattn_select.types import Phase

    torch, c, layout = case.torch, case.row, case.layout
    q, k, v = case.tensors
    dcfg = config_from_tensors(q, k, v, is_training=True, **case.kwargs)
    qb, kb, vb = (to_bhsd(t, layout) for t in case.tensors)
    # attention() builds its plans static; the dynamic-shape graph from this thread's kernel cache
    # is what a new batch size would get from the cache.
    variants = [("raw cuDNN graph (static)", False)]
    klass = dcfg.shape_class_key()
    if raw_dynamic and klass not in _DYNAMIC_CLASSES:
        # Only the first shape of a class: a kernel-cache graph for another batch/seqlen of a class
        # built before gave wrong outputs and once an illegal memory access here (H200, cuDNN 9.19),
        # which ends the process; section 6 checks that case on its own.
        _DYNAMIC_CLASSES.add(klass)
        variants.append(("raw cuDNN graph (dynamic shapes, kernel cache)", True))
    for label, dynamic in variants:
        if common.past(case.deadline, 6):
            c["impls"].append({"name": label, "status": common.skipped()})
            continue
        try:
            fwd = RawGraph(torch, dcfg, Phase.FORWARD, {"q": qb, "k": kb, "v": vb}, kernel_cache=dynamic)
            d_o = torch.empty_like(fwd.tensors["o"]).normal_()
            bwd = RawGraph(torch, dcfg, Phase.BACKWARD, {"q": qb, "k": kb, "v": vb, "o": fwd.tensors["o"],
                                                         "stats": fwd.tensors["stats"], "dO": d_o},
                           kernel_cache=dynamic)
        except Exception as err:  # noqa: BLE001
            c["impls"].append({"name": label, "status": common.error_status(err)})
            common.log(traceback.format_exc())
            continue
        fwd()
        torch.cuda.synchronize()
        checks.append(f"raw {'dynamic' if dynamic else 'static'} vs attention() fwd rel err "
                      f"{rel_err(fwd.tensors['o'], to_bhsd(out_att.detach(), layout)):.1e}")
        _record_raw(case, label, fwd, bwd, dynamic)
        del fwd, bwd, d_o


def _record_raw(case: _Case, label: str, fwd: RawGraph, bwd: RawGraph, dynamic: bool) -> None:
    def both(_: Any) -> None:
        fwd()
        bwd()

    impl = case.record(label, fwd, None, bwd, both)
    impl["build_ms"] = {"fwd": fwd.build_ms, "bwd": bwd.build_ms}
    impl["dynamic_shapes"] = {"fwd": fwd.build.dynamic_shapes, "bwd": bwd.build.dynamic_shapes}
    if not (fwd.build.dynamic_shapes and bwd.build.dynamic_shapes) and dynamic:
        impl["note"] = "static: " + ", ".join(
            n for n, b in (("fwd", fwd.build), ("bwd", bwd.build)) if not b.dynamic_shapes)
    if fwd.copied or bwd.copied or fwd.synthesized or bwd.synthesized:
        impl["binding"] = {"copied": fwd.copied + bwd.copied, "synthesized": fwd.synthesized + bwd.synthesized}


def _measure_sdpa(case: _Case, F: Any, out_att: Any, grad: Any, checks: list[str]) -> None:
    """torch SDPA with each backend on the same memory viewed as BHSD."""
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch, c, cfg, layout, tensors = case.torch, case.row, case.cfg, case.layout, case.tensors
    qb, kb, vb = (to_bhsd(t, layout) for t in tensors)
    blocker = sdpa_blocker(cfg.mask, cfg.window_size, cfg.seqlen_q, cfg.seqlen_kv)
    sdpa_kwargs = {"is_causal": cfg.mask == "causal", "scale": cfg.attn_scale,
                   "enable_gqa": cfg.num_heads_q != cfg.num_heads_kv}
    for backend_name in SDPA_BACKENDS:
        label = f"torch SDPA {backend_name}"
        if blocker:
            c["impls"].append({"name": label, "status": f"n/a: {blocker}"})
            continue
        if common.past(case.deadline, 5):
            c["impls"].append({"name": label, "status": common.skipped()})
            continue
        backend = getattr(SDPBackend, backend_name)

        def sdpa(_: Any = None) -> Any:
            return F.scaled_dot_product_attention(qb, kb, vb, **sdpa_kwargs)

        try:
            with sdpa_kernel(backend):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        out = sdpa()
                        torch.autograd.grad(out, tensors, from_layout(grad, layout, out))
                        torch.cuda.synchronize()
                    except Exception as err:  # noqa: BLE001
                        c["impls"].append({"name": label, "status": sdpa_reason(
                            str(err), [str(w.message) for w in caught])})
                        continue
                checks.append(f"attention() vs {backend_name} fwd rel err "
                              f"{rel_err(to_bhsd(out_att.detach(), layout), out.detach()):.1e}")
                g_bhsd = from_layout(grad, layout, out)
                del out
                # Timed later, in turns with the others: the functions take this backend's values.
                case.record(label, sdpa, sdpa, lambda o, g=g_bhsd: torch.autograd.grad(o, tensors, g),
                            lambda _, g=g_bhsd, f=sdpa: torch.autograd.grad(f(), tensors, g),
                            context=lambda b=backend: sdpa_kernel(b))
        except Exception as err:  # noqa: BLE001
            c["impls"].append({"name": label, "status": common.error_status(err)})


# ----- report ------------------------------------------------------------------------------------
def _config_rows(c: Mapping) -> list[tuple]:
    label = f"{c.get('file')} {c.get('name')}"
    if not common.is_ok(c.get("status", common.RESULT_STATUS_OK)) and not c.get("impls"):
        return [(label, c.get("status"), "", "", "", "", "", "", "")]
    rows = []
    if not common.is_ok(c.get("status", common.RESULT_STATUS_OK)):
        rows.append((label, f"(config {c.get('status')})", "", "", "", "", "", "", ""))
        label = ""
    base = None
    for impl in c.get("impls") or []:
        if impl.get("name") == "attention()":
            base = impl.get("fwd_bwd_ms")
    for impl in c.get("impls") or []:
        if not common.is_ok(impl.get("status", common.RESULT_STATUS_OK)):
            rows.append((label, impl.get("name"), impl.get("status"), "", "", "", "", "", ""))
            continue
        rows.append((
            label, impl.get("name") + (f" ({impl['note']})" if impl.get("note") else ""),
            common.fmt_stat(impl.get("fwd_ms")), common.fmt_stat(impl.get("bwd_ms")),
            common.fmt_stat(impl.get("fwd_bwd_ms")), common.fmt_num(impl.get("fwd_tflops")),
            common.fmt_num(impl.get("bwd_tflops")), common.fmt_num(impl.get("fwd_bwd_tflops")),
            common.fmt_ratio(common.ratio(impl.get("fwd_bwd_ms"), base)),
        ))
        label = ""  # the config name once per group
    return rows


def render(s: Mapping) -> str:
    parts = []
    rows = [row for c in s.get("configs") or [] for row in _config_rows(c)]
    if rows:
        parts.append(common.md_table(("config (shape)", "implementation", "fwd ms", "bwd ms", "fwd+bwd ms",
                               "fwd TFLOPS", "bwd TFLOPS", "fwd+bwd TFLOPS", "fwd+bwd time / attention()"),
                              rows))
    shapes = [(f"{c.get('file')} {c.get('name')}", c.get("shape", ""), common.fmt_num(c.get("fwd_tflop")),
               c.get("check", "")) for c in s.get("configs") or [] if c.get("shape")]
    if shapes:
        parts.append(common.md_table(("config", "shape", "fwd TFLOP (nominal)", "check"), shapes))
    for part in (*(fp8.render(s.get(key) or {}) for key in FP8_KEYS), host_overhead.render(s.get("tiny") or {})):
        if part:
            parts.append(part)
    return "\n\n".join(parts)
