"""Warmup stores plans under the key dispatch looks them up with (the cuDNN engine's plan_key and
dispatch both call dispatch_plan_key on the config call_config builds); if the keys ever differed,
warmed plans would silently never be used.

cuDNN is not here: the graph description (graph_signature), the device context and the store's
load-or-build are TEST DOUBLES, so these tests check which configs and phases each path keys, not
what cuDNN builds.
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select.config import AttnConfig  # noqa: E402
from fusedattn_select.plan_store import calls, keys, persistence  # noqa: E402
from fusedattn_select.probing.cudnn import cudnn_engine  # noqa: E402
from fusedattn_select.probing.cudnn import plan_graphs  # noqa: E402
from fusedattn_select.selection import plan_warmup  # noqa: E402
from fusedattn_select.runtime.api import FP8Scales, config_from_tensors  # noqa: E402
from fusedattn_select.types import Fingerprint  # noqa: E402

FINGERPRINT = Fingerprint("cuda", "Test GPU (plan-key test)", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")
SIGNATURE = keys.GraphSignature("sdpa", {"q": ((1, 1, 1, 1), (1, 1, 1, 1), "BFLOAT16")})
PERMS = {"bshd": (0, 2, 1, 3), "sbhd": (2, 0, 1, 3), "bhsd": (0, 1, 2, 3)}

BASE = AttnConfig(batch_size=2, num_heads_q=8, num_heads_kv=2, seqlen_q=128, seqlen_kv=256, head_dim_qk=64,
                  mask="causal")
PROBLEMS = {
    "train": BASE,
    "inference": BASE.replace(is_training=False),
    "sbhd": BASE.replace(qkv_layout="sbhd_sbhd_sbhd"),
    "bhsd": BASE.replace(qkv_layout="bhsd_bhsd_bhsd", is_training=False),
    "head_dim_v": BASE.replace(head_dim_v=32),
    "bias": BASE.replace(bias="post_scale_bias", bias_shape="1hss", mask="no_mask"),
    "alibi": BASE.replace(bias="alibi"),
    "window_dropout_deterministic": BASE.replace(window_size=(64, 0), dropout=0.1, deterministic=True),
    "padding_bottom_right": BASE.replace(mask="padding_causal_bottom_right"),
    "off_by_one_scale": BASE.replace(softmax="off_by_one", attn_scale=0.25),
    "fp8_inference": BASE.replace(qkv_dtype="fp8_e4m3", o_dtype="bf16", scaling_mode="current", is_training=False),
}


def _tensors(cfg: AttnConfig, dtype: torch.dtype):
    fmt = cfg.qkv_layout.split("_")[0]

    def tensor(b, h, s, d):
        return torch.empty((b, h, s, d), device="meta", dtype=dtype).permute(PERMS[fmt]).contiguous()

    q = tensor(cfg.batch_size, cfg.num_heads_q, cfg.seqlen_q, cfg.head_dim_qk)
    k = tensor(cfg.batch_size, cfg.num_heads_kv, cfg.seqlen_kv, cfg.head_dim_qk)
    v = tensor(cfg.batch_size, cfg.num_heads_kv, cfg.seqlen_kv, cfg.resolved_head_dim_v)
    return q, k, v, fmt


def _dispatch_config(cfg: AttnConfig) -> AttnConfig:
    """The config attention() derives from tensors of `cfg`'s problem (as a caller would pass them)."""
    fp8 = cfg.qkv_dtype.startswith("fp8")
    q, k, v, fmt = _tensors(cfg, torch.float8_e4m3fn if fp8 else torch.bfloat16)
    kwargs = dict(layout=fmt, mask=cfg.mask, window_size=cfg.window_size, attn_scale=cfg.attn_scale,
                  dropout=cfg.dropout, softmax=cfg.softmax, deterministic=cfg.deterministic)
    if cfg.has_padding:
        kwargs.update(seqlens_q=torch.empty(cfg.batch_size, dtype=torch.int32, device="meta"),
                      seqlens_kv=torch.empty(cfg.batch_size, dtype=torch.int32, device="meta"))
    if cfg.bias == "post_scale_bias":
        kwargs["bias"] = torch.empty(1, cfg.num_heads_q, cfg.seqlen_q, cfg.seqlen_kv, dtype=torch.bfloat16,
                                     device="meta")
    elif cfg.bias == "alibi":
        kwargs["alibi_slopes"] = torch.empty(cfg.num_heads_q, device="meta")
    if fp8:
        one = torch.empty(1, device="meta")
        kwargs["fp8"] = FP8Scales(one, one, one, o_dtype=torch.bfloat16)
    return config_from_tensors(q, k, v, is_training=cfg.is_training, **kwargs)


@pytest.fixture
def warmup_keys(monkeypatch):
    """persist_plans through the cuDNN engine's plan_key, with cuDNN replaced by TEST DOUBLES;
    returns the keys it stored under."""
    stored: list[str] = []
    monkeypatch.setattr(plan_graphs, "graph_signature", lambda cfg, backend, phase, handle=None: SIGNATURE)
    monkeypatch.setattr(cudnn_engine, "device_context", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(cudnn_engine, "handle_for", lambda device: "handle (test double)")
    monkeypatch.setattr(plan_warmup, "obtain", lambda key, **_: (stored.append(key), (None, persistence.BUILT))[1])
    engine = object.__new__(cudnn_engine.CudnnEngine)  # no device: only plan_key runs
    engine.device = 0

    def stored_keys(cfg: AttnConfig) -> list[str]:
        stored.clear()
        dispatched = calls.dispatch_config(cfg)
        assert dispatched is not None, calls.not_dispatched_reason(cfg)
        result = plan_warmup.persist_plans(dispatched, cfg.candidate, plan_warmup.PlanTarget(None, FINGERPRINT, engine))
        assert result.failure is None and result.built == len(cfg.phases)
        return list(stored)

    return stored_keys


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_warmup_stores_plans_under_the_keys_dispatch_looks_up(name, warmup_keys):
    cfg = PROBLEMS[name]
    dispatched = _dispatch_config(cfg)
    dispatch_keys = [plan_graphs.dispatch_plan_key(dispatched, dispatched.candidate, phase).key
                     for phase in dispatched.phases]
    assert warmup_keys(cfg) == dispatch_keys


def test_keys_differ_between_problems_and_phases(warmup_keys):
    keys = [key for cfg in PROBLEMS.values() for key in warmup_keys(cfg)]
    assert len(set(keys)) == len(keys)


def test_call_config_refuses_fields_a_call_does_not_set():
    fields = dict(batch_size=1, num_heads_q=1, num_heads_kv=1, seqlen_q=8, seqlen_kv=8, head_dim_qk=64,
                  qkv_layout="bshd_bshd_bshd", qkv_dtype="bf16", page_size=16)
    with pytest.raises(TypeError, match=r"fields a call does not set: \['page_size'\]"):
        calls.call_config(fields)
