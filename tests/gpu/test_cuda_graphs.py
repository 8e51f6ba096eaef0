"""attention() inside the caller's CUDA graphs, each case in a fresh process with a store of its own:

- a graph captured (torch.cuda.graph, CUDA's default global capture mode) right after a signature's first
  eager calls, while the runtime's own thread loads its plans from the store: the capture and its replays
  work, and no stored plan is dropped as "does not load";
- torch.compile(mode="reduce-overhead") (cudagraph trees), inference and training, with and without
  dropout: it runs, and without dropout matches eager attention();
- a compiled training call with dropout whose problem falls back (float32) under reduce-overhead: a
  ConfigError naming `dropout`, not CUDA's or the allocator's error.

Each case uses a problem class (head counts and head dim) no other GPU test uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from gpu_setup import GPU_MARKS, torch

pytestmark = GPU_MARKS
# cudagraph trees route one thread's allocations into their pool from torch 2.8 (before: one stream's, the
# caller's, which the runtime's kept tensors share): docs/dispatch.md, 'CUDA graphs'.
PER_THREAD_POOLS = pytest.mark.skipif(not hasattr(torch._C, "_cuda_beginAllocateCurrentThreadToPool"),
                                      reason="reduce-overhead needs torch 2.8 or later (docs/dispatch.md)")

_CASE = textwrap.dedent("""
    import json, sys, torch
    import fusedattn_select as fas
    from fusedattn_select.errors import ConfigError

    case, dropout, grad = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
    dtype = torch.float32 if case == "fallback" else torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 96, h, 40, generator=gen, device="cuda").to(dtype).requires_grad_(grad)
               for h in (6, 3, 3))
    attn = lambda a, b, c: fas.attention(a, b, c, dropout=dropout, mask="causal")

    def step(fn):
        out = fn(q, k, v)
        kept = out.detach().clone()  # (under capture: where each replay writes its output)
        if grad:
            out.float().square().sum().backward()
        return kept

    found = {}
    try:
        if case == "capture":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                expected = step(attn)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # at once: the runtime's thread is loading the plans meanwhile
                out = step(attn)
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
        else:  # training compiles the loss with the call, as a compiled training step does
            loss = lambda a, b, c: attn(a, b, c).float().square().sum()
            with torch.no_grad():
                expected = (loss if grad else attn)(q, k, v).detach().clone()
            fn = torch.compile(loss if grad else attn, mode="reduce-overhead")
            for _ in range(6):
                torch.compiler.cudagraph_mark_step_begin()
                for t in (q, k, v):  # as optimizer.zero_grad() does: the last step's grads are graph outputs
                    t.grad = None
                out = fn(q, k, v)
                if grad:
                    out.backward()
                out = out.detach().clone()
            torch.cuda.synchronize()
            if grad:
                found["grads_finite"] = all(bool(t.grad.isfinite().all()) for t in (q, k, v))
        found["ok"] = True
        if dropout == 0.0:
            found["error"] = float((out.double() - expected.double()).abs().max()) / float(expected.abs().max())
        found["finite"] = bool(out.isfinite().all())
    except ConfigError as err:
        found.update(ok=False, field=err.field, message=str(err))
    except Exception as err:
        found.update(ok=False, raised=type(err).__name__, message=str(err)[:500])
    print("RESULT " + json.dumps(found))
""")


def _run(tmp_path, *args):
    env = dict(os.environ, FUSEDATTN_SELECT_CACHE_DIR=str(tmp_path / "store"))
    done = subprocess.run([sys.executable, "-c", _CASE, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):]), done.stderr


@pytest.mark.parametrize("dropout, grad", [(0.0, False), (0.0, True), (0.1, True)])
def test_a_capture_while_the_runtime_loads_stored_plans_works_and_keeps_them(tmp_path, dropout, grad):
    for process in ("fills the store", "loads from it"):
        found, log = _run(tmp_path, "capture", dropout, int(grad))
        assert found["ok"] and found["finite"], (process, found, log[-3000:])
        if dropout == 0.0:
            assert found["error"] < 2e-2, (process, found)
        assert "does not load" not in log, (process, log[-3000:])


@PER_THREAD_POOLS
@pytest.mark.parametrize("dropout, grad", [(0.0, False), (0.0, True), (0.1, False), (0.1, True)])
def test_torch_compile_reduce_overhead_runs_and_matches_eager(tmp_path, dropout, grad):
    for process in ("fills the store", "loads from it"):
        found, log = _run(tmp_path, "compile", dropout, int(grad))
        assert found["ok"] and found["finite"] and found.get("grads_finite", True), (process, found, log[-3000:])
        if dropout == 0.0:
            assert found["error"] < 2e-2, (process, found)


@PER_THREAD_POOLS
def test_a_compiled_fallback_training_call_with_dropout_under_reduce_overhead_names_dropout(tmp_path):
    found, log = _run(tmp_path, "fallback", 0.1, 1)
    assert not found["ok"] and found.get("field") == "dropout", (found, log[-3000:])
    assert "CUDA graph" in found["message"], found
