"""Probe depth verify without a GPU: tolerances, the depth order, which problems verify can check,
the comparisons, the caching rules and the CLI (the chunked reference: tests/reference/).

The selector and CLI tests drive VerifyTestEngine, a TEST DOUBLE defined here: it probes nothing
and runs no graph. It answers at the depth asked; at depth verify it says "supported at stage
numerics" (verified) except for head dim 96, which it says computes wrong. GPU tests of the real
check are in tests/gpu/test_verify.py.
"""

from __future__ import annotations

import itertools
import json
import math
import sys

import pytest

from fusedattn_select import cli
from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError, PlatformError
from fusedattn_select.probing import choice
from fusedattn_select.probing.cudnn import numerics, tolerances
from fusedattn_select.selection.selector import Selector
from fusedattn_select.store.memory import MemoryStore
from fusedattn_select.types import NUMERICS_STAGE, Backend, Fingerprint, Outcome, Phase, ProbeDepth, Provenance, Verdict

FAST, FULL, VERIFY = ProbeDepth.FAST, ProbeDepth.FULL, ProbeDepth.VERIFY
BASE = {"batch_size": 2, "num_heads_q": 8, "num_heads_kv": 2, "seqlen_q": 256, "seqlen_kv": 256, "head_dim_qk": 64}


class VerifyTestEngine:
    """TEST DOUBLE (see the module docstring): scripted verdicts, counted calls, no probing."""

    name = "verify-test-engine"
    provenance = Provenance.LIVE_PROBE

    def __init__(self) -> None:
        self.calls: list[tuple[str, ProbeDepth]] = []

    def fingerprint(self) -> Fingerprint:
        return Fingerprint("test-double", "Test GPU", "9.0", 132, 91900, "1.32.0", "580.00", "0.1.0")

    def probe(self, cfg, backend, phase, depth) -> Verdict:
        self.calls.append((cfg.cache_key(), depth))
        timings = (("check_support", 1.0),)
        if depth is not VERIFY:
            return Verdict(backend, phase, Outcome.SUPPORTED, "check_support", "", "", self.provenance, depth, timings)
        if cfg.head_dim_qk == 96:
            checks = [tolerances.Check("O", 0.31, 0.0442, False)]
            return numerics.numerics_verdict(backend, phase, checks, {"numerics": 2.0})
        passed = [tolerances.Check("O", 0.004, 0.0442, True)]
        return numerics.numerics_verdict(backend, phase, passed, {"numerics": 2.0})


def config(**changes) -> AttnConfig:
    return AttnConfig(**{**BASE, **changes})


# ----- tolerances and depths -------------------------------------------------------------------
def test_tolerance_grows_with_the_unit_roundoff_and_the_head_dim():
    assert tolerances.tolerance("bf16", 64) == pytest.approx(8 * 2 ** -8)
    assert tolerances.tolerance("bf16", 32) == tolerances.tolerance("bf16", 64)
    assert tolerances.tolerance("bf16", 256) == pytest.approx(2 * tolerances.tolerance("bf16", 64))
    assert tolerances.tolerance("fp16", 128, "gradient") == pytest.approx(16 * 2 ** -11 * math.sqrt(2))
    assert tolerances.tolerance("fp16", 128) < tolerances.tolerance("bf16", 128)
    # A 25% error is far outside the bound at every head dim verify sees.
    assert all(tolerances.tolerance("bf16", d, "gradient") < 0.25 for d in (64, 128, 256, 512))
    assert tolerances.coarsest("fp16", "bf16") == "bf16"


@pytest.mark.parametrize("args, field", [(("fp8_e4m3", 64), "dtype"), (("bf16", 0), "head_dim"),
                                         (("bf16", 64, "lse"), "kind"), (("bf16", True), "head_dim")])
def test_tolerance_rejects_what_it_has_no_bound_for(args, field):
    with pytest.raises(ConfigError, match=field):
        tolerances.tolerance(*args)


def test_depths_parse_and_order():
    assert ProbeDepth.parse("verify") is VERIFY
    with pytest.raises(ConfigError, match="must be 'fast', 'full' or 'verify'"):
        ProbeDepth.parse("numerics")
    assert [(a.value, b.value) for a, b in itertools.product(ProbeDepth, repeat=2) if a.answers(b)] == [
        ("fast", "fast"), ("full", "fast"), ("full", "full"), ("verify", "fast"), ("verify", "full"),
        ("verify", "verify")]


def test_verified_means_supported_and_compared():
    passed = numerics.numerics_verdict(Backend.F16, Phase.FORWARD, [tolerances.Check("O", 0.01, 0.04, True)], {})
    failed = numerics.numerics_verdict(Backend.F16, Phase.FORWARD, [tolerances.Check("O", 0.3, 0.04, False)], {})
    assert passed.verified and passed.stage == NUMERICS_STAGE and passed.depth is VERIFY
    assert not failed.verified and failed.outcome is Outcome.UNSUPPORTED and failed.stage == NUMERICS_STAGE
    assert failed.message == "results differ from the float32 reference: O max error 0.3 (tolerance 0.04)"
    built = Verdict(Backend.F16, Phase.FORWARD, Outcome.SUPPORTED, "build_plans", depth=VERIFY)
    assert not built.verified  # depth verify, numerics not checked


def test_fp8_tolerance_is_three_unit_roundoffs_of_the_coarser_of_inputs_and_output():
    assert tolerances.fp8_tolerance("fp8_e4m3", "fp8_e4m3") == 3 * 2.0 ** -4
    assert tolerances.fp8_tolerance("fp8_e4m3", "bf16") == 3 * 2.0 ** -4  # P is rounded to the inputs' type
    assert tolerances.fp8_tolerance("fp8_e4m3", "fp8_e5m2") == tolerances.fp8_tolerance("fp8_e5m2", "bf16") == 3 / 8
    # A backward's: the coarsest of the inputs', dO's and the gradients' types.
    assert tolerances.fp8_tolerance("fp8_e4m3", "bf16", "fp8_e4m3") == 3 * 2.0 ** -4
    assert tolerances.fp8_tolerance("fp8_e4m3", "fp8_e4m3", "fp8_e5m2") == 3 / 8
    with pytest.raises(ConfigError, match="dtype='int8'"):
        tolerances.fp8_tolerance("fp8_e4m3", "int8")
    with pytest.raises(ConfigError, match="qkv_dtype"):
        tolerances.fp8_tolerance("bf16", "bf16")


def test_unchecked_problems_say_why():
    assert numerics.unchecked_reason(config(), Backend.F16) == ""
    fp8 = config(qkv_dtype="fp8_e4m3")
    assert numerics.unchecked_reason(fp8, Backend.FP8) == ""  # forward and backward
    mxfp8 = config(qkv_dtype="fp8_e4m3", scaling_mode="mxfp8")
    assert numerics.unchecked_reason(mxfp8, Backend.FP8).startswith("MXFP8 graphs")
    paged = config(qkv_layout="paged_kv_bshd_bshd_bshd", page_size=64, num_pages=16, is_training=False,
                   mask="padding")
    assert numerics.unchecked_reason(paged, Backend.F16) == ""  # bound through seeded page tables


def test_verify_without_torch_is_a_platform_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(PlatformError, match="probe depth 'verify' runs the graphs with torch, which is not installed"):
        numerics.verify(object(), config(), Backend.F16, Phase.FORWARD)


# ----- comparisons and the reference (torch on the CPU) ------------------------------------------
def test_compare_scales_by_the_reference_and_fails_non_finite():
    torch = pytest.importorskip("torch")
    want = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    assert tolerances.compare("O", want + 0.01, want, 0.01).error == pytest.approx(0.005)
    assert not tolerances.compare("O", want * 1.25, want, 0.05).passed
    assert not tolerances.compare("O", want.masked_fill(want == 0, float("nan")), want, 0.05).passed
    rows = torch.tensor([True, False])
    assert tolerances.compare("O", torch.tensor([[1.0, -2.0], [9.0, 9.0]]), want, 0.01, rows).passed


def test_extent_leaves_a_bucket_slot_unused_and_seeds_lengths():
    pytest.importorskip("torch")
    from fusedattn_select.probing.cudnn import verify_run

    ragged = config(qkv_layout="thd_thd_thd", mask="padding_causal", batch_size=4, seqlen_q=1024, seqlen_kv=1024)
    extent = verify_run.extent_for(ragged, 7)
    assert (extent.batch, extent.seqlen_q, extent.ragged) == (3, 768, True)
    assert extent.lens_q[0] == 768 and all(384 <= n <= 768 for n in extent.lens_q)
    assert extent == verify_run.extent_for(ragged, 7)
    dense = verify_run.extent_for(config(), 7)
    assert dense.lens_q == (256, 256) and not dense.ragged
    assert verify_run.ragged_tensors(ragged) == {"q", "k", "v", "o", "dO", "dQ", "dK", "dV"}


class _Declared:
    """The dims and strides a graph declared (a GraphBuild's `dims_strides`, without cuDNN)."""

    def __init__(self, **dims_strides):
        self.dims_strides = dims_strides


def test_paged_containers_are_read_through_seeded_page_tables_as_a_decode_kernel_reads_them():
    torch = pytest.importorskip("torch")
    from fusedattn_select.probing.cudnn import verify_run

    cfg = config(qkv_layout="paged_kv_bshd_bshd_bshd", page_size=4, num_pages=7, batch_size=2, seqlen_q=1,
                 seqlen_kv=10, num_heads_q=4, num_heads_kv=2, head_dim_qk=8, is_training=False, mask="padding")
    pages, heads, size, dim = 7, 2, 4, 8
    container = ((pages, heads, size, dim), (size * heads * dim, dim, heads * dim, 1))  # BSHD pages
    build = _Declared(k=container, v=container, page_table_k=((2, 1, 3, 1), (3, 3, 1, 1)),
                      page_table_v=((2, 1, 3, 1), (3, 3, 1, 1)))
    bound = verify_run.new_bound(cfg, torch.device("cpu"), 11)
    for name in ("k", "v"):
        bound.tensors[name] = torch.randn(pages * size * heads * dim).as_strided(*container)
    tables = {name: verify_run._input(bound, build, f"page_table_{name}") for name in ("k", "v")}
    for table in tables.values():
        used = table.flatten().tolist()
        assert table.shape == (2, 1, 3, 1) and len(set(used)) == 6 and all(0 <= p < pages for p in used)
    assert not torch.equal(tables["k"], tables["v"])  # K and V are shuffled apart
    again = verify_run.new_bound(cfg, torch.device("cpu"), 11)
    assert torch.equal(verify_run._input(again, build, "page_table_k"), tables["k"])  # seeded
    for name in ("k", "v"):
        view = bound.view(name)
        assert view.shape == (2, heads, 10, dim)
        for b in range(2):
            for position in range(10):
                page = int(tables[name][b, 0, position // size, 0])
                assert torch.equal(view[b, :, position], bound.tensors[name][page, :, position % size])


@pytest.mark.parametrize("in_type, o_type, o_scaled", [("FP8_E4M3", "FP8_E4M3", True), ("FP8_E4M3", "BFLOAT16", False),
                                                      ("FP8_E5M2", "FP8_E4M3", True)])
def test_fp8_inputs_and_scales_are_bound_as_dispatch_quantizes(in_type, o_type, o_scaled):
    torch = pytest.importorskip("torch")
    from fusedattn_select import dtypes
    from fusedattn_select.probing.cudnn import verify_run

    in_name = {"FP8_E4M3": "fp8_e4m3", "FP8_E5M2": "fp8_e5m2"}[in_type]
    cfg = config(qkv_dtype=in_name, num_heads_kv=8, is_training=False)
    qkv = ((2, 8, 256, 64), (8 * 256 * 64, 256 * 64, 64, 1))
    scalar = ((1, 1, 1, 1), (1, 1, 1, 1))
    declared = dict(q=qkv, k=qkv, v=qkv, o=qkv, **{n: scalar for n in verify_run._FP8_SCALARS})
    build = _Declared(**declared)
    build.data_types = {**{n: f"data_type.{in_type}" for n in "qkv"}, "o": f"data_type.{o_type}",
                        **{n: "data_type.FLOAT" for n in verify_run._FP8_SCALARS}}
    bound = verify_run.new_bound(cfg, torch.device("cpu"), 5)
    bound_values = {n: verify_run._input(bound, build, n) for n in ("descale_q", "scale_s", "descale_s", "scale_o")}
    q = bound.tensors["q"]
    scale, top = bound.scales["q"], dtypes.BY_NAME[in_name].largest
    assert q.dtype == dtypes.torch_dtype(in_name, torch) and math.log2(scale).is_integer()
    assert top / 2 < float(q.float().abs().max()) <= top  # the largest magnitude just below the type's top
    assert float(bound_values["descale_q"]) == 1.0 / scale
    assert float(bound_values["scale_s"]) == dtypes.FP8_SOFTMAX_SCALE == 1.0 / float(bound_values["descale_s"])
    assert ("o" in bound.scales) is o_scaled
    if o_scaled:  # O's scale sized for O's type from V's largest real value: O cannot overflow it
        scale_o, largest_v = float(bound_values["scale_o"]), float(bound.dequantized("v").abs().max())
        assert math.log2(scale_o).is_integer() and 448.0 / 2 < largest_v * scale_o <= 448.0
        assert (scale_o == bound.scales["v"]) is (in_type == o_type)
    else:
        assert float(bound_values["scale_o"]) == 1.0
    # The reference reads real values: the FP8 copy divided by its scale, e4m3's rounding away from normals.
    real = bound.dequantized("q")
    assert real.dtype == torch.float32 and float(real.abs().max()) == float(q.float().abs().max()) / scale


def test_a_page_pool_too_small_for_unshared_pages_is_not_bound():
    torch = pytest.importorskip("torch")
    from fusedattn_select.probing.cudnn import verify_run

    cfg = config(qkv_layout="paged_kv_bshd_bshd_bshd", page_size=4, num_pages=5, batch_size=2, seqlen_q=1,
                 seqlen_kv=10, is_training=False, mask="padding")
    build = _Declared(k=((5, 8, 4, 64), (2048, 64, 512, 1)), page_table_k=((2, 1, 3, 1), (3, 3, 1, 1)))
    bound = verify_run.new_bound(cfg, torch.device("cpu"), 11)
    with pytest.raises(verify_run.Unbindable, match="5 pages cannot give 2 sequences 3 pages each"):
        verify_run._input(bound, build, "page_table_k")


# ----- caching rules ---------------------------------------------------------------------------
def test_a_verified_answer_answers_every_depth_and_a_full_one_does_not_answer_verify():
    engine = VerifyTestEngine()
    selector = Selector(engine, store=MemoryStore())
    cfg = config(is_training=False)
    assert selector.select(cfg, "full").selected and engine.calls[-1][1] is FULL
    verified = selector.select(cfg, "verify")
    assert verified.selected and engine.calls[-1][1] is VERIFY and all(v.verified for v in verified.verdicts)
    calls = len(engine.calls)
    for depth in ("fast", "full", "verify"):
        assert selector.select(cfg, depth).from_cache
    assert len(engine.calls) == calls
    fresh = Selector(engine, store=selector.store)  # another process, the same store
    assert fresh.select(cfg, "verify").from_cache and len(engine.calls) == calls


def test_a_numerics_mismatch_is_none_and_never_stored_as_supported():
    engine = VerifyTestEngine()
    store = MemoryStore()
    selector = Selector(engine, store=store)
    cfg = config(head_dim_qk=96, is_training=False)
    answer = selector.select(cfg, "verify")
    assert answer.backend is Backend.NONE and "at numerics: results differ" in answer.message
    stored, depth = store.get(engine.fingerprint(), cfg.cache_key())
    assert depth is VERIFY and all(v.outcome is Outcome.UNSUPPORTED for v in stored)
    assert selector.select(cfg, "fast").backend is Backend.NONE  # dispatch asks fast: it falls back


def test_the_store_keeps_a_verified_entry_over_a_shallower_one():
    store = MemoryStore()
    fingerprint = VerifyTestEngine().fingerprint()
    verified = numerics.numerics_verdict(Backend.F16, Phase.FORWARD, [tolerances.Check("O", 0.01, 0.04, True)], {})
    assert store.put(fingerprint, "k", (verified,), VERIFY)
    built = Verdict(Backend.F16, Phase.FORWARD, Outcome.SUPPORTED, "build_plans", depth=FULL)
    assert not store.put(fingerprint, "k", (built,), FULL)
    assert store.get(fingerprint, "k")[1] is VERIFY


# ----- the command line ------------------------------------------------------------------------
PROBLEM = ["--set", "batch_size=2", "--set", "num_heads_q=8", "--set", "num_heads_kv=2", "--set", "seqlen_q=256",
           "--set", "seqlen_kv=256", "--set", "head_dim_qk=64", "--set", "is_training=false"]


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def verify_engine(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(tmp_path / "cache"))
    engine = VerifyTestEngine()
    monkeypatch.setattr(choice, "live_engine", lambda: (engine, ""))
    return engine


def test_why_verify_shows_verified_answers(capsys, verify_engine):
    code, out, _ = run(capsys, "why", "--verify", "--json", *PROBLEM)
    document = json.loads(out)
    assert code == 0 and document["probe_depth"] == "verify" and document["results"][0]["verified"] is True
    code, out, _ = run(capsys, "why", "--verify", *PROBLEM)
    assert code == 0 and "depth asked: verify" in out and " verified " in out


def test_why_refuses_full_and_verify_together_naming_both(capsys, verify_engine):
    # Two depths asked at once: one would be dropped silently, so it is a usage error.
    code, _, err = run(capsys, "why", "--full", "--verify", *PROBLEM)
    assert code == 2 and "--verify" in err and "--full" in err and "Traceback" not in err
    assert verify_engine.calls == []  # nothing was asked


def test_why_verify_reports_a_missing_torch_as_an_error_line(capsys, monkeypatch, tmp_path):
    class NeedsTorchTestEngine(VerifyTestEngine):
        """TEST DOUBLE: raises what the live engine raises at depth verify where torch is missing."""

        def probe(self, cfg, backend, phase, depth):
            if depth is VERIFY:
                raise PlatformError("probe depth 'verify' runs the graphs with torch, which is not installed")
            return super().probe(cfg, backend, phase, depth)

    monkeypatch.setenv("FUSEDATTN_SELECT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(choice, "live_engine", lambda: (NeedsTorchTestEngine(), ""))
    code, _out, err = run(capsys, "why", "--verify", *PROBLEM)
    assert code == 2 and err.startswith("error: probe depth 'verify'") and "Traceback" not in err


def test_matrix_counts_verified_answers(capsys, verify_engine, tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: s\ndefaults: {batch_size: 2, num_heads_q: 8, num_heads_kv: 2, seqlen_q: 256, "
                     "seqlen_kv: 256, is_training: false}\nconfigs:\n  - {name: a, head_dim_qk: 64}\n"
                     "  - {name: b, head_dim_qk: 128}\n  - {name: wrong, head_dim_qk: 96}\n")
    _code, out, _ = run(capsys, "matrix", str(suite), "--depth", "verify")
    assert "probe depth verify" in out and "total: 2/3 v2" in out
    _code, out, _ = run(capsys, "matrix", str(suite), "--depth", "verify", "--json")
    document = json.loads(out)
    assert {p["name"]: p["verified"] for p in document["problems"]} == {"a": True, "b": True, "wrong": False}


def test_warmup_and_snapshot_record_accept_depth_verify(capsys, verify_engine, tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: s\ndefaults: {batch_size: 2, num_heads_q: 8, num_heads_kv: 2, seqlen_q: 256, "
                     "seqlen_kv: 256, is_training: false}\nconfigs:\n  - {name: a, head_dim_qk: 64}\n")
    code, _out, err = run(capsys, "warmup", str(suite), "--depth", "verify")
    assert code == 0, err
    assert (verify_engine.calls[-1][1]) is VERIFY
    target = tmp_path / "snap.json"
    code, _, err = run(capsys, "snapshot", "record", str(suite), "-o", str(target), "--depth", "verify", "--no-ladder")
    assert code == 0, err
    recorded = json.loads(target.read_text())
    assert recorded["depth"] == "verify"


def test_a_backward_whose_forward_is_refused_is_not_checked_rather_than_refused(monkeypatch):
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from fusedattn_select.probing.cudnn import verify_checks
    from fusedattn_select.probing.cudnn.messages import CudnnUnsupported

    built = []

    def refused(cfg, backend, handle, device, seam):
        built.append(cfg)
        raise CudnnUnsupported("create_execution_plans", "no engine for this forward")

    monkeypatch.setattr(verify_checks, "_run_forward", refused)
    cfg = config(return_max_logit=True)
    with pytest.raises(verify_checks.Unbindable, match="forward graph that makes its inputs is refused "
                                                      r"\(no engine for this forward\)"):
        verify_checks._forward_for_backward(cfg, Backend.F16, None, 0, tolerances.Planted(), SimpleNamespace())
    assert [c.return_max_logit for c in built] == [False]  # built without the output the backward never reads



@pytest.mark.parametrize("dropout", [0.0, 0.1, 0.5, 0.6])
def test_an_fp8_o_scale_under_dropout_is_bound_as_dispatch_binds_it(dropout):
    torch = pytest.importorskip("torch")
    from fusedattn_select.probing.cudnn import verify_run
    from fusedattn_select.runtime import fp8 as runtime_fp8
    from fusedattn_select.runtime.fp8_kernels import STATE

    cfg = config(qkv_dtype="fp8_e4m3", num_heads_kv=8, is_training=False, dropout=dropout)
    qkv = ((2, 8, 256, 64), (8 * 256 * 64, 256 * 64, 64, 1))
    scalar = ((1, 1, 1, 1), (1, 1, 1, 1))
    build = _Declared(q=qkv, k=qkv, v=qkv, o=qkv, **{n: scalar for n in verify_run._FP8_SCALARS})
    build.data_types = {**{n: "data_type.FP8_E4M3" for n in "qkvo"}, **{n: "data_type.FLOAT" for n in verify_run._FP8_SCALARS}}
    bound = verify_run.new_bound(cfg, torch.device("cpu"), 5)
    verify_scale_o = float(verify_run._input(bound, build, "scale_o"))
    v8 = bound.tensors["v"]
    descales = [torch.tensor([1.0]), torch.tensor([1.0]), torch.tensor([1.0 / bound.scales["v"]])]
    state = runtime_fp8.explicit_state(runtime_fp8.FP8Scales(*descales, o_dtype=torch.float8_e4m3fn), v8,
                                       torch.float8_e4m3fn, dropout)
    assert verify_scale_o == float(state[STATE.index("scale_o")])
