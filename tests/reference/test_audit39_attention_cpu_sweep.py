"""attention() on CPU tensors (torch SDPA or the float32 reference, whichever dispatch picks) and the chunked
reference, against an oracle written here: a float64 softmax per (batch, head) over a visibility matrix
built key by key from docs' rules (semantics.py). Outputs, log-sum-exp and the gradients of q, k, v, a
trainable bias and a learnable sink, over every mask, windows (asymmetric, 0-width, bottom-right), unequal
lengths both ways, GQA/MQA, head_dim_v != head_dim_qk, every layout, packed QKV views, scales, the softmax
variants, ALiBi, padding lengths down to 0 and fp16/bf16/fp32."""

import math
import random

import pytest

torch = pytest.importorskip("torch")

from fusedattn_select import attention  # noqa: E402
from fusedattn_select.reference import chunked_reference  # noqa: E402

TO_BHSD = {"bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3), "bhsd": (0, 1, 2, 3)}
MASKS = ("no_mask", "causal", "causal_bottom_right", "padding", "padding_causal", "padding_causal_bottom_right")
WINDOWS = ((-1, -1), (0, 0), (2, 0), (0, 2), (3, 1), (1, 3), (-1, 0), (0, -1), (2, -1), (-1, 2))
# max |error| / max(|oracle|, FLOOR): outputs, gradients. A gradient that is 0 analytically (a row that
# sees one key) is float32 noise around 0, hence the floor.
TOLERANCE = {torch.float32: (4e-5, 1e-4), torch.float16: (8e-3, 1.6e-2), torch.bfloat16: (6e-2, 1.2e-1)}
FLOOR = 0.05


def _visible(sq, skv, mask, window, len_q, len_kv):
    """(sq, skv) bool, key by key; and the diagonal's offset."""
    offset = len_kv - len_q if mask.endswith("bottom_right") else 0
    seen = torch.zeros(sq, skv, dtype=torch.bool)
    for i in range(min(sq, len_q)):
        for j in range(min(skv, len_kv)):
            d = i + offset
            seen[i, j] = (("causal" not in mask or j <= d) and (window[0] < 0 or j >= d - window[0])
                          and (window[1] < 0 or j <= d + window[1]))
    return seen, offset


def oracle(q, k, v, mask="no_mask", window=(-1, -1), scale=None, bias=None, slopes=None, softmax="vanilla",
           sink=None, lens_q=None, lens_kv=None):
    """(out (B, Hq, Sq, Dv), lse (B, Hq, Sq)) in float64 of logical-BHSD q, k, v (differentiable)."""
    batch, hq, sq, d = q.shape
    skv, group = k.shape[2], hq // k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    outs, lses = [], []
    for b in range(batch):
        len_q = sq if lens_q is None else lens_q[b]
        len_kv = skv if lens_kv is None else lens_kv[b]
        seen, offset = _visible(sq, skv, mask, window, len_q, len_kv)
        real = (torch.arange(sq) < len_q).double()
        head_out, head_lse = [], []
        for h in range(hq):
            vh = v[b, h // group].double()
            s = q[b, h].double() @ k[b, h // group].double().T * scale
            if bias is not None:
                s = s + bias[b % bias.shape[0], h % bias.shape[1]].double()
            if slopes is not None:
                i = torch.arange(sq, dtype=torch.float64).view(-1, 1)
                s = s + float(slopes[h]) * (torch.arange(skv, dtype=torch.float64).view(1, -1) - (i + offset))
            s = s.masked_fill(~seen, float("-inf"))
            if softmax != "vanilla":  # one more logit, with a zero value vector
                extra = torch.zeros(sq, 1, dtype=torch.float64) if softmax == "off_by_one" else sink[h].double().expand(sq, 1)
                s = torch.cat([s, extra], -1)
                vh = torch.cat([vh, torch.zeros(1, vh.shape[1], dtype=torch.float64)])
            some = torch.isfinite(s).any(-1, keepdim=True)
            s = torch.where(some, s, torch.zeros_like(s))
            p = torch.where(some, torch.softmax(s, -1), torch.zeros_like(s))
            head_out.append((p @ vh) * real.view(-1, 1))
            head_lse.append(torch.where(some.squeeze(-1), torch.logsumexp(s, -1), torch.zeros(sq, dtype=torch.float64)) * real)
        outs.append(torch.stack(head_out))
        lses.append(torch.stack(head_lse))
    return torch.stack(outs), torch.stack(lses)


def _error(got, want, rows=None):
    got, want = got.detach().double(), want.detach().double()
    if rows is not None:
        got, want = got * rows, want * rows
    return float((got - want).abs().max()) / max(FLOOR, float(want.abs().max()))


def _draw(rng):
    hkv = rng.choice([1, 2])
    mask = rng.choice(MASKS)
    window = rng.choice(WINDOWS)
    if "causal" in mask and window[1] not in (-1, 0):
        window = (window[0], 0)
    bias = rng.choice([None, None, "11", "1h", "b1", "bh"])
    return dict(dtype=rng.choice([torch.float32, torch.float16, torch.bfloat16]),
                layout=rng.choice(sorted(TO_BHSD)), batch=rng.choice([1, 2, 3]), hkv=hkv,
                hq=hkv * rng.choice([1, 2, 3]), sq=rng.choice([1, 2, 3, 5, 8, 13]),
                skv=rng.choice([1, 2, 4, 5, 8, 11]), d=rng.choice([4, 8, 16]), dv=rng.choice([4, 8, 12]),
                mask=mask, window=window, scale=rng.choice([None, None, 0.3, 1.7]), bias=bias,
                bias_grad=bias is not None and rng.random() < 0.6, alibi=bias is None and rng.random() < 0.25,
                softmax=rng.choice(["vanilla", "vanilla", "off_by_one", "learnable"]), lse=rng.random() < 0.4,
                sink_grad=rng.random() < 0.7, seed=rng.randrange(1 << 30))


def _inputs(p):
    gen = torch.Generator().manual_seed(p["seed"])
    dtype, perm = p["dtype"], TO_BHSD[p["layout"]]

    def tensor(*dims):  # logical BHSD drawn, stored in the caller's dim order
        inverse = [perm.index(i) for i in range(4)]
        return torch.randn(*dims, generator=gen).to(dtype).permute(inverse).contiguous().requires_grad_(True)

    q = tensor(p["batch"], p["hq"], p["sq"], p["d"])
    k = tensor(p["batch"], p["hkv"], p["skv"], p["d"])
    v = tensor(p["batch"], p["hkv"], p["skv"], p["dv"])
    extra = {}
    if p["bias"]:
        dims = (p["batch"] if p["bias"][0] == "b" else 1, p["hq"] if p["bias"][1] == "h" else 1, p["sq"], p["skv"])
        extra["bias"] = torch.randn(*dims, generator=gen).to(dtype).requires_grad_(p["bias_grad"])
    if p["alibi"]:
        extra["alibi_slopes"] = torch.rand(p["hq"], generator=gen)
    if p["softmax"] == "learnable":
        extra["sink"] = torch.randn(p["hq"], generator=gen).to(dtype).requires_grad_(p["sink_grad"])
    if p["mask"].startswith("padding"):
        extra["seqlens_q"] = torch.randint(0, p["sq"] + 1, (p["batch"],), generator=gen, dtype=torch.int32)
        extra["seqlens_kv"] = torch.randint(0, p["skv"] + 1, (p["batch"],), generator=gen, dtype=torch.int32)
    return q, k, v, extra


def _oracle_of(p, q, k, v, extra):
    perm = TO_BHSD[p["layout"]]
    lens_q, lens_kv = extra.get("seqlens_q"), extra.get("seqlens_kv")
    return oracle(q.permute(perm), k.permute(perm), v.permute(perm), p["mask"], p["window"], p["scale"],
                  extra.get("bias"), extra.get("alibi_slopes"), p["softmax"], extra.get("sink"),
                  None if lens_q is None else lens_q.tolist(), None if lens_kv is None else lens_kv.tolist())


@pytest.mark.usefixtures("no_platform")
@pytest.mark.parametrize("block", range(8))
def test_attention_on_cpu_matches_the_oracle(block):
    rng = random.Random(3900 + block)
    for _ in range(60):
        p = _draw(rng)
        q, k, v, extra = _inputs(p)
        result = attention(q, k, v, layout=p["layout"], mask=p["mask"], window_size=p["window"],
                           attn_scale=p["scale"], softmax=p["softmax"], return_lse=p["lse"], **extra)
        out, lse = result if p["lse"] else (result, None)
        leaves = [t for t in (q, k, v, extra.get("bias"), extra.get("sink")) if t is not None and t.requires_grad]
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(p["seed"] + 1)).to(p["dtype"])
        grads = torch.autograd.grad(out, leaves, grad_out)
        exact = [t.detach().double().requires_grad_(True) for t in leaves]
        swap = dict(zip(map(id, leaves), exact))
        q64, k64, v64 = (swap[id(t)] for t in (q, k, v))
        extra64 = {n: swap.get(id(t), t) for n, t in extra.items()}
        want, want_lse = _oracle_of(p, q64, k64, v64, extra64)
        want_grads = torch.autograd.grad(want, exact, grad_out.double().permute(TO_BHSD[p["layout"]]))
        tol_out, tol_grad = TOLERANCE[p["dtype"]]
        assert out.shape == want.permute([TO_BHSD[p["layout"]].index(i) for i in range(4)]).shape, p
        assert _error(out.permute(TO_BHSD[p["layout"]]), want) <= tol_out, p
        if lse is not None:
            assert lse.shape == (p["batch"], p["hq"], p["sq"], 1) and lse.dtype == torch.float32, p
            assert float((lse.detach().squeeze(-1).double() - want_lse).abs().max()) <= 2e-3 * max(1.0, float(want_lse.abs().max())), p
        for got, exp in zip(grads, want_grads):
            assert not torch.isnan(got).any(), p
            assert _error(got, exp) <= tol_grad, p


def _packed_views(form, leaves):
    if form in ("bs3hd", "sb3hd"):
        return leaves[0].unbind(2)
    if form in ("bsh3d", "sbh3d"):
        return leaves[0].unbind(3)
    return (leaves[0],) + tuple(leaves[1].unbind(2 if form.endswith("2hd") else 3))


@pytest.mark.usefixtures("no_platform")
@pytest.mark.parametrize("form", ["bs3hd", "bsh3d", "sb3hd", "sbh3d", "bshd_bs2hd", "sbhd_sbh2d"])
@pytest.mark.parametrize("call", ["no_mask", "causal", "off_by_one", "padding", "window"])
def test_packed_qkv_views(form, call):
    """q, k, v as views of one packed tensor (or Q apart, K/V packed): outputs and the packed gradients."""
    keywords = {"no_mask": {}, "causal": dict(mask="causal"), "off_by_one": dict(softmax="off_by_one"),
                "padding": dict(mask="padding", seqlens_q=torch.tensor([6, 3]), seqlens_kv=torch.tensor([2, 6])),
                "window": dict(window_size=(1, 2))}[call]
    layout = "bshd" if form.startswith("bs") else "sbhd"
    lead = (2, 6) if layout == "bshd" else (6, 2)
    gen = torch.Generator().manual_seed(7)
    if form.endswith(("3hd", "h3d")):
        dims = [(*lead, 3, 4, 8) if form.endswith("3hd") else (*lead, 4, 3, 8)]
    else:
        dims = [(*lead, 4, 8), (*lead, 2, 4, 8) if form.endswith("2hd") else (*lead, 4, 2, 8)]
    leaves = [torch.randn(*d, generator=gen).requires_grad_(True) for d in dims]
    out = attention(*_packed_views(form, leaves), layout=layout, **keywords)
    grad_out = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad(out, leaves, grad_out)
    exact = [t.detach().double().requires_grad_(True) for t in leaves]
    perm = TO_BHSD[layout]
    q, k, v = (t.permute(perm) for t in _packed_views(form, exact))
    lens = [keywords[n].tolist() if n in keywords else None for n in ("seqlens_q", "seqlens_kv")]
    want, _ = oracle(q, k, v, keywords.get("mask", "no_mask"), keywords.get("window_size", (-1, -1)),
                     softmax=keywords.get("softmax", "vanilla"), lens_q=lens[0], lens_kv=lens[1])
    want_grads = torch.autograd.grad(want, exact, grad_out.double().permute(perm))
    assert _error(out.permute(perm), want) <= 4e-5
    for got, exp in zip(grads, want_grads):
        assert _error(got, exp) <= 1e-4


@pytest.mark.parametrize("chunk_elements", [0, 300, 37])
def test_chunked_reference_matches_the_oracle(monkeypatch, chunk_elements):
    """The chunked forward, log-sum-exp (real rows) and analytic backward, one chunk or many."""
    if chunk_elements:
        monkeypatch.setattr(chunked_reference, "CHUNK_ELEMENTS", chunk_elements)
    rng = random.Random(39 + chunk_elements)
    for _ in range(80):
        p = _draw(rng)
        p.update(layout="bhsd", lse=True, sq=rng.choice([1, 3, 7, 16, 33]), skv=rng.choice([1, 4, 9, 16, 40]))
        if p["bias"] and p["bias"][0] == "b":
            p["bias"] = "1" + p["bias"][1]  # the reference's dBias is that of a bias shared by the batch
        q, k, v, extra = _inputs(p)
        q, k, v = (t.detach() for t in (q, k, v))
        bias, sink = (extra[n].detach() if n in extra else None for n in ("bias", "sink"))
        batch, padded = p["batch"], p["mask"].startswith("padding")
        lens_q = extra["seqlens_q"].long() if padded else torch.full((batch,), p["sq"])
        lens_kv = extra["seqlens_kv"].long() if padded else torch.full((batch,), p["skv"])
        scale = p["scale"] or 1 / math.sqrt(p["d"])
        problem = chunked_reference.RefProblem(
            q, k, v, lens_q, lens_kv, scale, "causal" in p["mask"], p["mask"].endswith("bottom_right"), *p["window"],
            bias=bias, alibi=extra.get("alibi_slopes"), softmax=p["softmax"], sink=sink)
        out, lse, _ = chunked_reference.forward(problem)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(p["seed"]))
        grads = chunked_reference.backward(problem, grad_out, bias_grad=bias is not None)
        exact = [t.double().requires_grad_(True) for t in (q, k, v)]
        bias64 = None if bias is None else bias.double().requires_grad_(True)
        sink64 = None if sink is None else sink.double().requires_grad_(True)
        want, want_lse = oracle(*exact, p["mask"], p["window"], scale, bias64, extra.get("alibi_slopes"), p["softmax"],
                                sink64, lens_q.tolist() if padded else None, lens_kv.tolist() if padded else None)
        real = (torch.arange(p["sq"]).view(1, 1, -1) < lens_q.view(-1, 1, 1)).double()
        assert _error(out, want, real.unsqueeze(-1)) <= 1e-5, p
        assert float(((lse.double() - want_lse) * real).abs().max()) <= 1e-4, p
        wrt = exact + [t for t in (bias64, sink64) if t is not None]
        want_grads = torch.autograd.grad(want, wrt, grad_out.double())
        got = [grads.dq, grads.dk, grads.dv]
        if bias64 is not None:
            got.append(grads.dbias.sum(1, keepdim=True) if bias.shape[1] == 1 else grads.dbias)
        if sink64 is not None:
            got.append(grads.dsink)
        for name, mine, exp in zip(("dq", "dk", "dv", "extra", "extra"), got, want_grads):
            assert _error(mine, exp) <= 1e-4, (name, p)
