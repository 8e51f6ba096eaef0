"""Build ahead per model on the device: a process that registers a model (register(model=...)) has
the worker build that model's bucket plans into the store, and a second, fresh process runs the
model's prefill and decode steps from the store, building no plan itself.

Each side runs in its own fresh process over one private cache directory. A tiny random Llama
(head dim 64, 4/2 heads, max_position_embeddings 256): its ladder is 3 prefill and 3 decode buckets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_setup import GPU_MARKS  # skips this module without torch or cudnn-frontend

pytestmark = GPU_MARKS
pytest.importorskip("transformers")

_PROCESS = textwrap.dedent("""
    import json, sys
    import torch
    from hf_test_models import TinyModels
    from transformers import AutoModelForCausalLM
    from fusedattn_select.buckets import bucket_form
    from fusedattn_select.integrations.transformers import build_ahead, register
    from fusedattn_select.runtime.api import dispatch_info
    from fusedattn_select.selection.selector import default_selector

    tiny = TinyModels(vocab=128, seq=48, window=16, hidden=256, intermediate=512, head_dim=64, init_range=0.1,
                      softcap=5.0, experts_per_tok=2, pad=7)
    config = tiny.config("llama", max_position_embeddings=256)
    register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="fusedattn")
    model = model.to("cuda", torch.bfloat16).eval()
    calls = build_ahead.model_calls(model)
    if sys.argv[1] == "register":
        register(model=model)
        finished = build_ahead.wait(timeout=400)
        info = dispatch_info()
        print(json.dumps({"finished": finished, "buckets": len(calls),
                          **{name: info[name] for name in ("ahead_queued", "ahead_built", "ahead_skipped",
                                                           "ahead_failed", "plan_builds")}}))
        sys.exit(0)
    selector = default_selector()
    stored = [selector.store.get(selector.fingerprint, bucket_form(c).cache_key()) is not None for c in calls]
    ids = torch.randint(1, 128, (1, 50), device="cuda")
    with torch.no_grad():
        model(ids)                                            # a prefill in the 64 bucket
        model(torch.randint(1, 128, (1, 200), device="cuda"))  # and in the 256 one
        model.generate(ids, max_new_tokens=30, do_sample=False)  # decode steps over 50..79 keys
    info = dispatch_info()
    print(json.dumps({"stored": stored, "plan_builds": info["plan_builds"], "plan_loads": info["plan_loads"],
                      "fused_calls": info["fused_calls"]}))
""")


def _process(cache_dir: Path, mode: str) -> dict:
    tests = Path(__file__).resolve().parents[1]  # hf_test_models
    env = dict(os.environ, FUSEDATTN_SELECT_CACHE_DIR=str(cache_dir),
               PYTHONPATH=os.pathsep.join([str(tests), *sys.path]),
               # The second process decides each call on its path: what the store lacks it would build.
               FUSEDATTN_SELECT_FIRST_CALLS="torch" if mode == "register" else "wait")
    done = subprocess.run([sys.executable, "-c", _PROCESS, mode], check=False, env=env, capture_output=True,
                          text=True, timeout=560)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_starts_with_the_plans_of_the_registered_models_buckets(tmp_path):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    first = _process(cache_dir, "register")
    assert first["finished"], first
    assert first["ahead_queued"] == first["buckets"] == 6, first
    assert first["ahead_failed"] == 0 and first["ahead_built"] + first["ahead_skipped"] == 6, first
    assert first["plan_builds"] == 0, "the registering process built plans: the worker should have"
    second = _process(cache_dir, "run")
    assert all(second["stored"]), second
    assert second["plan_builds"] == 0, f"the fresh process built plans the store should have held: {second}"
    assert second["plan_loads"] > 0 and second["fused_calls"] > 0, second
