"""Section 6, plan build for a new batch size: building a problem class's graph for a new batch size
or sequence length (dynamic shapes, kernel cache) vs a cold build, and the same through attention()."""

from __future__ import annotations

import time
import traceback
from typing import Any, Mapping

from tools.bench import common
from tools.bench.problems import attention_kwargs, dispatch_format, load_file
from tools.bench.raw_graph import RawGraph
from tools.bench.runner import Runner
from tools.bench.tensors import qkv, rel_err, to_bhsd


# ----- parent ------------------------------------------------------------------------------------
def run(runner: Runner) -> dict:
    return runner.worker_section("rebuild", {
        "file": "llama-3-8b", "entry": "train-bf16", "seqlen": 4096,
        "batches": list(runner.plan["rebuild_batches"]), "seqlens": list(runner.plan["rebuild_seqlens"]),
        "dispatch_file": "qwen2.5-7b", "dispatch_entry": "train-bf16",
    }, "plan_rebuild", [
        "Each build is probing.cudnn.build_graph(depth=FULL); with a kernel cache the graph has dynamic "
        "shapes, so a new batch size or sequence length of the class reuses the compiled kernels (where "
        "cuDNN accepts dynamic shapes for the graph).",
        "attention() builds its plans static (runtime.plans.build_plan: a kernel-cache forward warmed by "
        "another sequence length returned NaN on H200), so through attention() a new batch size costs a "
        "static build; the correctness line checks the kernel-cache forward here.",
    ])


# ----- worker ------------------------------------------------------------------------------------
def worker(args: Mapping, res: common.Partial) -> None:
    cfg = load_file(args["file"]).get(args["entry"]).config
    if args.get("seqlen"):
        cfg = cfg.replace(seqlen_q=int(args["seqlen"]), seqlen_kv=int(args["seqlen"]))
    res["problem"] = (f"{args['file']} {args['entry']} at b{cfg.batch_size} s{cfg.seqlen_q} "
                      f"(h{cfg.num_heads_q}/{cfg.num_heads_kv} d{cfg.head_dim_qk} {cfg.mask}); new batches "
                      f"{list(args['batches'])}, new seqlens {list(args['seqlens'])}")
    res["graphs"] = []
    _graph_builds(args, cfg, res)
    # the same through attention(): first call (select + cold builds), a new batch size, steady state
    d: dict[str, Any] = {"rows": []}
    res["dispatch"] = d
    try:
        _through_attention(args, d)
        d["status"] = common.RESULT_STATUS_OK
    except Exception as err:  # noqa: BLE001
        d["status"] = common.error_status(err)
        common.log(traceback.format_exc())
    # Last, because a wrong kernel-cache graph can end the process (illegal memory access): are the
    # kernel-cache graphs right? Forward outputs vs the static graph on the same inputs.
    res["checks"] = []
    try:
        _kernel_cache_checks(args, cfg, res)
    except Exception as err:  # noqa: BLE001
        res["checks"].append({"name": "check", "status": common.error_status(err)})
        common.log(traceback.format_exc())


def _graph_builds(args: Mapping, cfg: Any, res: common.Partial) -> None:
    """Cold, new-batch and new-seqlen builds with the kernel cache, and static builds, per graph."""
    from fusedattn_select.probing import cudnn as probe
    from fusedattn_select.types import Backend, Phase, ProbeDepth

    with probe.device_context(0):
        handle = probe.handle_for(0)

        def build(c: Any, phase: Any, cache: bool) -> float:
            kc = probe.kernel_cache_for(c, Backend.F16, phase, 0) if cache else None
            started = time.perf_counter()
            built = probe.build_graph(c, Backend.F16, phase, handle=handle, depth=ProbeDepth.FULL, kernel_cache=kc)
            ms = (time.perf_counter() - started) * 1e3
            if cache:
                g.setdefault("dynamic_shapes", []).append(bool(built.dynamic_shapes))
                if built.note:
                    g["note"] = common.first_line(built.note, 300)
            del built
            return ms

        for phase in (Phase.FORWARD, Phase.BACKWARD):
            g: dict[str, Any] = {"phase": phase.value}
            res["graphs"].append(g)
            try:
                g["cold_ms"] = common.summarize([build(cfg, phase, True)], "ms")
                g["new_batch_ms"] = common.summarize([build(cfg.replace(batch_size=b), phase, True)
                                               for b in args["batches"]], "ms")
                g["new_seqlen_ms"] = common.summarize([build(cfg.replace(seqlen_q=s, seqlen_kv=s), phase, True)
                                                for s in args["seqlens"]], "ms")
                static_cfg = cfg.replace(batch_size=max(args["batches"]) + 1)
                g["static_new_batch_ms"] = common.summarize([build(static_cfg, phase, False)], "ms")
                g["static_again_ms"] = common.summarize([build(static_cfg, phase, False) for _ in range(2)], "ms")
                g["status"] = common.RESULT_STATUS_OK
            except Exception as err:  # noqa: BLE001
                g["status"] = common.error_status(err)
                common.log(traceback.format_exc())
            res.save()


def _through_attention(args: Mapping, d: dict) -> None:
    """attention() forward+backward at a batch size, then at a new one, then steady: wall ms."""
    import torch

    import fusedattn_select as fas
    from fusedattn_select.runtime.api import attention, dispatch_info

    dcfg = load_file(args["dispatch_file"]).get(args["dispatch_entry"]).config
    layout = dispatch_format(dcfg.qkv_layout)
    kwargs = attention_kwargs(dcfg, layout)
    d["problem"] = (f"{args['dispatch_file']} {args['dispatch_entry']}: h{dcfg.num_heads_q}/{dcfg.num_heads_kv} "
                    f"s{dcfg.seqlen_q} d{dcfg.head_dim_qk} {dcfg.mask}, batch {dcfg.batch_size} then "
                    f"{dcfg.batch_size + 1}; same process as the builds above")
    torch.zeros(1, device="cuda")

    def call(batch: int) -> dict:
        q, k, v = qkv(torch, dcfg.replace(batch_size=batch), layout, requires_grad=True)
        torch.cuda.synchronize()
        before, info0 = dispatch_info(), fas.cache_info()
        started = time.perf_counter()
        out = attention(q, k, v, **kwargs)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        torch.cuda.synchronize()
        ms = (time.perf_counter() - started) * 1e3
        after, info1 = dispatch_info(), fas.cache_info()
        return {"ms_value": ms, "plan_builds": after.get("plan_builds", 0) - before.get("plan_builds", 0),
                "plan_build_ms": after.get("plan_build_ms", 0) - before.get("plan_build_ms", 0),
                "probes": info1.get("probes", 0) - info0.get("probes", 0)}

    for label, batch in ((f"first call, batch {dcfg.batch_size} (select + plan builds)", dcfg.batch_size),
                         (f"first call, new batch {dcfg.batch_size + 1} (new plans)", dcfg.batch_size + 1)):
        row = call(batch)
        row["name"] = label
        row["ms"] = common.summarize([row.pop("ms_value")], "ms")
        d["rows"].append(row)
    steady = [call(dcfg.batch_size + 1) for _ in range(5)]
    d["rows"].append({"name": "later call, same shape (plans cached)",
                      "ms": common.summarize([r["ms_value"] for r in steady], "ms"),
                      "plan_builds": sum(r["plan_builds"] for r in steady), "plan_build_ms": 0.0,
                      "probes": sum(r["probes"] for r in steady)})


def _kernel_cache_checks(args: Mapping, cfg: Any, res: common.Partial) -> None:
    import torch

    from fusedattn_select.types import Phase

    layout = dispatch_format(cfg.qkv_layout) or "bshd"
    for label, c in (("new batch", cfg.replace(batch_size=int(args["batches"][0]))),
                     ("new seqlen", cfg.replace(seqlen_q=int(args["seqlens"][0]),
                                                seqlen_kv=int(args["seqlens"][0])))):
        q, k, v = (to_bhsd(t, layout) for t in qkv(torch, c, layout, requires_grad=False))
        dyn = RawGraph(torch, c, Phase.FORWARD, {"q": q, "k": k, "v": v}, kernel_cache=True)
        sta = RawGraph(torch, c, Phase.FORWARD, {"q": q, "k": k, "v": v}, kernel_cache=False)
        dyn()
        sta()
        torch.cuda.synchronize()
        res["checks"].append({
            "name": label, "dynamic_shapes": bool(dyn.build.dynamic_shapes),
            "rel_err_vs_static": rel_err(dyn.tensors["o"], sta.tensors["o"]),
            "nan": bool(torch.isnan(dyn.tensors["o"]).any()),
        })
        del dyn, sta, q, k, v
        res.save()


# ----- report ------------------------------------------------------------------------------------
def _graph_row(g: Mapping) -> tuple:
    if not common.is_ok(g.get("status", common.RESULT_STATUS_OK)) and not g.get("cold_ms"):
        return (g.get("phase"), g.get("status"), "", "", "", "", "")
    dyn = g.get("dynamic_shapes") or []
    kind = "dynamic" if dyn and all(dyn) else "static (cuDNN rejects dynamic shapes)" if dyn and not any(dyn) \
        else "mixed" if dyn else "?"
    return (
        f"{g.get('phase')} ({kind})", common.fmt_stat(g.get("cold_ms")), common.fmt_stat(g.get("new_batch_ms")),
        common.fmt_stat(g.get("new_seqlen_ms")), common.fmt_stat(g.get("static_new_batch_ms")),
        common.fmt_stat(g.get("static_again_ms")),
        common.fmt_ratio(common.ratio(g.get("cold_ms"), g.get("new_batch_ms"))),
    )


def _check_text(c: Mapping) -> str:
    if c.get("status"):
        return f"{c.get('name')}: {c.get('status')}"
    return (f"{c.get('name')}: rel err {common.fmt_num(c.get('rel_err_vs_static'))}"
            f"{', NaN in output' if c.get('nan') else ''}"
            f"{'' if c.get('dynamic_shapes') else ' (built static)'}")


def render(s: Mapping) -> str:
    parts = []
    rows = [_graph_row(g) for g in s.get("graphs") or []]
    if rows:
        parts.append(f"Problem class: {s.get('problem', '?')}; graphs built with build_graph(depth=FULL) "
                     "on one thread, in a fresh process.\n\n" + common.md_table(
                         ("graph", "cold build ms (dynamic shapes)", "new batch ms (kernel cache)",
                          "new seqlen ms (kernel cache)", "static build, new batch ms",
                          "static build, same graph again ms", "cold / new batch"), rows))
    checks = s.get("checks") or []
    if checks:
        parts.append("Forward output of the kernel-cache graph vs the static graph on the same inputs: "
                     + "; ".join(_check_text(c) for c in checks) + ".")
    d = s.get("dispatch") or {}
    if d.get("rows"):
        parts.append(f"Through attention() ({d.get('problem', '')}, forward+backward, wall ms incl. sync):\n\n"
                     + common.md_table(("call", "ms", "plan builds", "plan build ms", "probes"), [
                         (r.get("name"), common.fmt_stat(r.get("ms")) if r.get("ms") else r.get("status", "n/a"),
                          r.get("plan_builds", ""), common.fmt_num(r.get("plan_build_ms")), r.get("probes", ""))
                         for r in d["rows"]]))
    elif d.get("status"):
        parts.append(f"Through attention(): {d.get('status')}")
    return "\n\n".join(parts)
