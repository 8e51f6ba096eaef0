"""Depth verify's binding of an FP8 backward graph on the CPU (no cuDNN): the scales it binds are the
ones runtime/fp8.backward_feeds computes for the same call, but for the gradients' scales once the
reference has given their largest magnitudes (sized as delayed scaling sizes them); and the checks of
the graph's two executions (verify_checks._worse)."""

from __future__ import annotations

import math

import pytest

from fusedattn_select.config import AttnConfig

torch = pytest.importorskip("torch")


class _Declared:
    """The dims and strides a graph declared (a GraphBuild's `dims_strides`, without cuDNN)."""

    def __init__(self, **dims_strides):
        self.dims_strides = dims_strides


class _Spec:
    def __init__(self, dtype):
        self.dtype = dtype


class _FeedPlan:
    """What runtime/fp8.backward_feeds reads of a plan (its tensors' dtypes), binding tensors as given."""

    def __init__(self, torch, dtypes_by_name):
        self.torch, self.specs = torch, {name: _Spec(dtype) for name, dtype in dtypes_by_name.items()}

    def has(self, name):
        return name in self.specs

    def conform(self, name, tensor):
        return tensor

    def constant(self, name, value):
        return self.torch.full((1, 1, 1, 1), value)


@pytest.mark.parametrize("grads, d_o, dropout", [("FP8_E4M3", "FP8_E5M2", 0.0), ("FP8_E4M3", "FP8_E4M3", 0.5),
                                                 ("FP8_E4M3", "BFLOAT16", 0.0), ("BFLOAT16", "BFLOAT16", 0.0)])
def test_fp8_backward_scales_are_bound_as_dispatch_binds_them(grads, d_o, dropout):
    # The scales verify binds for an FP8 backward graph are the ones runtime/fp8.backward_feeds
    # computes from the same real values: dO's descale, dS's scale, and, before the reference has given
    # the gradients' largest magnitudes, each FP8 gradient's scale.
    from fusedattn_select import dtypes
    from fusedattn_select.probing.cudnn import verify_run
    from fusedattn_select.runtime import fp8

    cfg = AttnConfig(qkv_dtype="fp8_e4m3", num_heads_q=8, num_heads_kv=2, seqlen_q=64, seqlen_kv=64, head_dim_qk=32,
                 batch_size=2, mask="causal", dropout=dropout)
    qkv = ((2, 8, 64, 32), (8 * 64 * 32, 64 * 32, 32, 1))
    kv = ((2, 2, 64, 32), (2 * 64 * 32, 64 * 32, 32, 1))
    scalar = ((1, 1, 1, 1), (1, 1, 1, 1))
    names = ("descale_q", "descale_k", "descale_v", "descale_o", "descale_dO", "descale_dP", "scale_dP", "scale_dQ",
             "scale_dK", "scale_dV")
    build = _Declared(q=qkv, k=kv, v=kv, o=qkv, dO=qkv, dQ=qkv, dK=kv, dV=kv, **{n: scalar for n in names})
    build.data_types = {**{n: "data_type.FP8_E4M3" for n in ("q", "k", "v", "o")}, "dO": f"data_type.{d_o}",
                        **{n: f"data_type.{grads}" for n in ("dQ", "dK", "dV")},
                        **{n: "data_type.FLOAT" for n in names}}
    bound = verify_run.new_bound(cfg, torch.device("cpu"), 11)
    # What the forward check leaves: O in e4m3 at V's scale.
    v = verify_run._input(bound, build, "v")
    bound.scales["o"] = bound.scales["v"]
    bound.tensors["o"] = v.float()[:, :1].expand(2, 8, 64, 32).to(v.dtype)
    bound_values = {n: float(verify_run._input(bound, build, n)) for n in names}

    # Dispatch's saved state of the same call: the inputs' descales and real amaxes, V's row norm.
    real = {n: bound.dequantized(n) for n in ("q", "k", "v", "dO")}
    state = dict.fromkeys(fp8.STATE, float("nan"))
    state.update({f"descale_{n}": 1.0 / bound.scales[n] for n in "qkv"}, descale_o=1.0 / bound.scales["o"],
                 **{f"amax_{n}": float(real[n].abs().max()) for n in "qkv"},
                 vnorm=float(torch.linalg.vector_norm(real["v"], dim=-1).max()))
    state = torch.tensor([state[n] for n in fp8.STATE])
    saved = tuple(bound.tensors[n] for n in "qkv") + (state,)
    plan = _FeedPlan(torch, {n: dtypes.torch_dtype(dtypes.from_cudnn(t), torch) for n, t in build.data_types.items()})
    out = bound.dequantized("o").to(torch.bfloat16)
    feeds, descales = fp8.backward_feeds(plan, cfg, saved, out, real["dO"], torch.zeros(2, 8, 64, 1))
    for name in ("descale_q", "descale_k", "descale_v", "descale_o", "scale_dP", "descale_dP"):
        assert bound_values[name] == float(feeds[name]), name
    # dO is quantized as the forward's inputs are (current scaling of the seeded values).
    assert bound_values["descale_dO"] == (1.0 / bound.scales["dO"] if d_o.startswith("FP8") else 1.0)
    fp8_grads = grads.startswith("FP8")
    for name in ("dQ", "dK", "dV"):
        assert bound_values["scale_" + name] == float(feeds["scale_" + name]), name
        assert (name in bound.scales) is fp8_grads and (name in descales) is fp8_grads
        if fp8_grads:  # sized from the bound: the largest real value it allows fits the type
            assert bound.scales[name] == 1.0 / float(descales[name]) and math.log2(bound.scales[name]).is_integer()
    # The scale of s dS (what cuDNN scales by scale_dP) brings its bound just below dtypes.FP8_INTERNAL_RANGE.
    bound_ds = cfg.resolved_attn_scale * 2.0 / (1.0 - dropout) * float(
        torch.linalg.vector_norm(real["dO"], dim=-1).max()) * float(torch.linalg.vector_norm(real["v"], dim=-1).max())
    assert dtypes.FP8_INTERNAL_RANGE / 2 < bound_ds * bound_values["scale_dP"] <= dtypes.FP8_INTERNAL_RANGE


def test_fp8_gradient_scales_are_sized_from_the_reference_amax_with_a_power_of_two_of_headroom():
    from fusedattn_select import dtypes
    from fusedattn_select.probing.cudnn import verify_run

    cfg = AttnConfig(qkv_dtype="fp8_e4m3", num_heads_q=8, num_heads_kv=8, seqlen_q=64, seqlen_kv=64, head_dim_qk=32,
                     batch_size=2, mask="causal")
    qkv = ((2, 8, 64, 32), (8 * 64 * 32, 64 * 32, 32, 1))
    scalar = ((1, 1, 1, 1), (1, 1, 1, 1))
    build = _Declared(q=qkv, k=qkv, v=qkv, o=qkv, dO=qkv, dQ=qkv, dK=qkv, dV=qkv, scale_dK=scalar, scale_dP=scalar)
    build.data_types = {**{n: "data_type.FP8_E4M3" for n in ("q", "k", "v", "o", "dQ", "dK", "dV")},
                        "dO": "data_type.FP8_E5M2", "scale_dK": "data_type.FLOAT", "scale_dP": "data_type.FLOAT"}
    bound = verify_run.new_bound(cfg, torch.device("cpu"), 11)
    q, k, v = (verify_run._input(bound, build, n) for n in "qkv")
    bound.scales["o"] = bound.scales["v"]
    bound.tensors["o"] = v
    bound.gradient_amax = {"dQ": 3.0, "dK": 0.01, "dV": float("inf")}
    scale_dk = float(verify_run._input(bound, build, "scale_dK"))
    # 2 x 0.01 brought just below e4m3's 448: 448 / 2 < 0.02 x scale <= 448.
    assert 448.0 / 2 < 0.02 * scale_dk <= 448.0 and bound.scales["dK"] == scale_dk
    bounds = verify_run._bounds_of(bound)
    assert bound.gradient_bounds["dV"] == bounds["dV"]  # no finite amax: its bound
    assert bound.gradient_bounds["dP"] == bounds["dP"]  # dS's scale is dispatch's
    assert float(verify_run._input(bound, build, "scale_dP")) == dtypes.fp8_scale(bounds["dP"], "fp8_e4m3",
                                                                                  dtypes.FP8_INTERNAL_RANGE)


@pytest.mark.parametrize("first, second, reported", [
    ((0.1, True), (0.2, True), ("dK", 0.2)),           # both pass: the larger error, not a race
    ((0.1, True), (0.05, True), ("dK", 0.1)),
    ((0.1, True), (3.0, False), ("dK (second execution)", 3.0)),  # only the second misses: it races
    ((3.0, False), (0.1, True), ("dK", 3.0)),
    ((2.0, False), (5.0, False), ("dK", 5.0)),         # both miss: the larger, not named for either
])
def test_the_check_reported_of_two_executions(first, second, reported):
    from fusedattn_select.probing.cudnn import verify_checks
    from fusedattn_select.probing.cudnn.tolerances import Check

    got = verify_checks._worse(Check("dK", first[0], 0.375, first[1]), Check("dK", second[0], 0.375, second[1]))
    assert (got.name, got.error) == reported
