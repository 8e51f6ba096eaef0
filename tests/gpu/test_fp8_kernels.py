"""The Triton FP8 kernels of runtime/fp8_kernels.py against their torch fallbacks on a GPU: the same
fp8 bytes and states for BSHD/SBHD/BHSD views and odd sizes, dequantization, delayed scaling's
recorded history, and CUDA-graph capture."""

from __future__ import annotations

import pytest
from gpu_setup import CUDA, GPU_MARKS, torch

from fusedattn_select.runtime import fp8_kernels as fp8k
from fusedattn_select.runtime.fp8 import FP8History, dequantize, quantize_qkv
from fusedattn_select.runtime.run_settings import run_settings

pytestmark = GPU_MARKS
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
BF16, FP16 = torch.bfloat16, torch.float16
BACK = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}


@pytest.fixture
def use(use_settings):
    """use("triton") / use("torch"): the implementation the next calls get (the environment's
    choice again after the test)."""
    pytest.importorskip("triton")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no FP8 conversions before sm_89")
    assert fp8k._load_triton() is None

    def choose(name):
        use_settings(fp8_kernels=name)
        fp8k.backend(refresh=True)
    yield choose
    run_settings.reread()
    fp8k.backend(refresh=True)


def _bhsd(b, h, s, d, layout="bshd", dtype=BF16, scale=1.0, seed=0):
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    order = {"bshd": (b, s, h, d), "sbhd": (s, b, h, d), "bhsd": (b, h, s, d)}[layout]
    return (torch.randn(order, generator=gen, device=CUDA) * scale).to(dtype).permute(BACK[layout])


def _qkv(layout, dims=(3, 5, 37, 72), hkv=1, dtype=BF16, mult=(1.0, 1.0, 1.0), seed=0):
    b, h, s, d = dims
    return (_bhsd(b, h, s, d, layout, dtype, mult[0], seed), _bhsd(b, hkv, s, d, layout, dtype, mult[1], seed + 1),
            _bhsd(b, hkv, s, d, layout, dtype, mult[2], seed + 2))


def _same(a, b, what):
    assert a.stride() == b.stride(), f"{what}: strides {a.stride()} vs {b.stride()}"
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), f"{what}: bytes differ"


def _both(use, fn):
    use("triton")
    got = fn()
    use("torch")
    want = fn()
    torch.cuda.synchronize()
    return got, want


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
@pytest.mark.parametrize("dtype, fp8", [(BF16, E4M3), (FP16, E4M3), (BF16, E5M2)])
def test_current_scaling_matches_fallback(use, layout, dtype, fp8):
    q, k, v = _qkv(layout, dtype=dtype, mult=(3.0, 700.0 if dtype == BF16 else 60.0, 1e-3))
    assert fp8k.uses_triton(q, k, v)
    got, want = _both(use, lambda: quantize_qkv(q, k, v, fp8, training=True))
    for name, a, b in zip("qkv", got[:3], want[:3]):
        _same(a, b, name)
        assert a.stride() == {"q": q, "k": k, "v": v}[name].stride()
    assert torch.equal(got[3][:6], want[3][:6])
    assert got[3][6].item() == pytest.approx(want[3][6].item(), rel=1e-5)
    assert torch.equal(got[3][7:9], want[3][7:9]) and got[3][7] == got[3][2]  # O's scales are V's


@pytest.mark.parametrize("dims", [(1, 1, 1, 8), (2, 3, 4099, 64), (2, 32, 4096, 128)])
def test_sizes_from_one_block_to_many_programs(use, dims):
    q, k, v = _qkv("bshd", dims=dims, hkv=max(1, dims[1] // 4), mult=(5.0, 0.2, 40.0))
    q.as_strided((q.numel(),), (1,))[-1] = 2000.0  # the amax in the very last element of memory
    got, want = _both(use, lambda: quantize_qkv(q, k, v, E4M3))
    for name, a, b in zip("qkv", got[:3], want[:3]):
        _same(a, b, name)
    assert torch.equal(got[3][:6], want[3][:6]) and got[3][3].item() == 2000.0
    assert torch.isnan(got[3][6])


def test_packed_views_fall_back():
    qkv = torch.randn(2, 16, 3, 4, 32, device=CUDA, dtype=BF16)
    q = qkv[:, :, 0].permute(0, 2, 1, 3)
    assert not fp8k.uses_triton(q)
    q8, _, _, state = quantize_qkv(q, q, q, E4M3)
    assert torch.equal(q8.float(), (q.float() / state[0]).clamp(-448, 448).to(E4M3).float())


@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
@pytest.mark.parametrize("dtype", [BF16, FP16, torch.float32])
def test_dequantize_matches(use, layout, dtype):
    x8 = _bhsd(3, 5, 37, 72, layout, scale=50.0).to(E4M3)
    for descale in (2.0 ** -7, 2.0 ** 3, 2.0 ** 20):
        d = torch.tensor([descale], device=CUDA)
        got, want = _both(use, lambda d=d: dequantize(x8, d, dtype))
        assert got.stride() == x8.stride() and got.dtype == dtype
        assert torch.equal(got, want)


def test_scaled_cast_inverse_and_amax(use):
    x = _bhsd(2, 4, 300, 64, "sbhd", scale=30.0)
    scale = torch.tensor([0.25], device=CUDA)

    def run():
        amax = torch.tensor([1.0], device=CUDA)
        return fp8k.scaled_cast(x, scale, E5M2, inverse=True, amax_out=amax), amax
    (g8, gamax), (w8, wamax) = _both(use, run)
    _same(g8, w8, "x8")
    assert gamax.item() == wamax.item() == x.float().abs().max().item()
    use("triton")
    assert torch.equal(fp8k.amax([x, x[:1]]).cpu(), torch.stack([x.float().abs().max(), x[:1].float().abs().max()]).cpu())


@pytest.mark.parametrize("algo, length, margin", [("max", 3, 0), ("most_recent", 16, 1), ("max", 1, 2)])
def test_delayed_scaling_matches_and_records(use, algo, length, margin):
    mults = [(1.0, 1.0, 1.0), (8.0, 0.5, 2.0), (0.1, 3.0, 2.0), (1.0, 1.0, 50.0), (2.0, 2.0, 2.0)]
    hists = {"triton": FP8History(length, algo, margin), "torch": FP8History(length, algo, margin)}
    for i, mult in enumerate(mults):
        q, k, v = _qkv("bshd", dims=(2, 8, 257, 128), hkv=2, mult=mult, seed=i)
        out = {}
        for name in ("triton", "torch"):
            use(name)
            out[name] = quantize_qkv(q, k, v, E4M3, history=hists[name])
        torch.cuda.synchronize()
        for t, a, b in zip("qkv", out["triton"][:3], out["torch"][:3]):
            _same(a, b, f"call {i} {t}")
        assert torch.equal(out["triton"][3][:6], out["torch"][3][:6]), f"call {i} state"
        assert torch.equal(out["triton"][3][7:9], out["torch"][3][7:9]), f"call {i} O's scales"
        assert out["triton"][3][3:6].tolist() == [x.float().abs().max().item() for x in (q, k, v)]
        assert torch.equal(hists["triton"]._buf, hists["torch"]._buf), f"call {i} history"
    # the running amax and the count of finished programs are zeroed again (by the cast's last program)
    assert hists["triton"]._buf[(length + 1) * 3:].eq(0).all()


def test_cuda_graph_capture(use):
    use("triton")
    q, k, v = _qkv("bshd", dims=(2, 8, 512, 128), hkv=2, mult=(2.0, 1.0, 1.0))
    hist = FP8History(length=4)
    for _ in range(2):  # first call: current scaling and the buffers; second: the delayed kernels compile
        quantize_qkv(q, k, v, E4M3, history=hist, training=True)
    plain = quantize_qkv(q, k, v, E4M3)
    dequantize(plain[0], plain[3][0:1], BF16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = quantize_qkv(q, k, v, E4M3, history=hist)
        static_plain = quantize_qkv(q, k, v, E4M3)
        static_back = dequantize(static_plain[0], static_plain[3][0:1], BF16)
    before = hist._buf.clone()
    q.mul_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    use("torch")
    twin = FP8History(length=4)
    twin._buf, twin.calls = before, 3
    want = quantize_qkv(q, k, v, E4M3, history=twin)
    want_plain = quantize_qkv(q, k, v, E4M3)
    torch.cuda.synchronize()
    for t, a, b in zip("qkv", static[:3], want[:3]):
        _same(a, b, f"replayed delayed {t}")
    assert torch.equal(static[3][:6], want[3][:6])
    assert torch.equal(hist._buf, twin._buf)
    _same(static_plain[0], want_plain[0], "replayed current q")
    assert torch.equal(static_back, dequantize(want_plain[0], want_plain[3][0:1], BF16))


@pytest.mark.parametrize("algo, length", [("max", 1), ("most_recent", 3), ("max", 2)])
def test_zero_and_infinite_amaxes_keep_the_scale_on_both(use, algo, length):
    # TransformerEngine's rule (fp8_kernels._good_reduced): an amax of 0 or not finite keeps the previous
    # scale, 1.0 while there is none. (NaN inputs: their amax is unspecified, the torch test covers it.)
    hists = {"triton": FP8History(length, algo), "torch": FP8History(length, algo)}
    for i, fill in enumerate([0.0, None, None, float("inf"), None, None, 0.0, None, None]):
        q, k, v = _qkv("bshd", dims=(2, 4, 129, 64), hkv=2, mult=(2.0, 1.0, 4.0 + i), seed=i)
        if fill is not None:
            v = torch.full_like(v, fill)
        out = {}
        for name in ("triton", "torch"):
            use(name)
            out[name] = quantize_qkv(q, k, v, E4M3, history=hists[name], dropout=0.1)
        torch.cuda.synchronize()
        for t, a, b in zip("qkv", out["triton"][:3], out["torch"][:3]):
            _same(a, b, f"call {i} {t}")
        assert torch.equal(out["triton"][3][:6], out["torch"][3][:6]), f"call {i} state"
        assert torch.equal(out["triton"][3][7:9], out["torch"][3][7:9]), f"call {i} O's scales"
        assert out["triton"][3][8] == 0.5 / out["triton"][3][2]  # dropout 0.1: O's scale is V's / 2
        assert torch.isfinite(out["triton"][3][:3]).all() and (out["triton"][3][:3] > 0).all(), f"call {i}"
        assert torch.equal(hists["triton"]._buf, hists["torch"]._buf), f"call {i} history"
    assert out["triton"][3][2] != 1.0  # the last calls scale from real amaxes again


def test_fp16_dequantization_clamps_on_both(use):
    x = torch.tensor([[65504.0, 1.0, -65000.0, 3.0]] * 64, dtype=FP16, device=CUDA)
    use("torch")
    (x8,), info = fp8k.quantize([x], E4M3)
    got, want = _both(use, lambda: dequantize(x8, info[0:1], FP16))
    assert torch.equal(got, want) and got[0].tolist() == [65504.0, 1.0, -65504.0, 3.0]
