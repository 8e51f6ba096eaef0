"""The float32 reference depth `verify` compares cuDNN's results with, computed in chunks of query rows.

The reference is written out (forward and the analytic backward) instead of left to autograd, so a
chunk of query rows holds only (batch, heads of one KV group, rows, keys) scores at a time: memory
stays bounded for long sequences. What a chunk computes (diagonal, causal mask, window, padding, bias,
ALiBi, the off_by_one and learnable softmax) is `semantics.py`'s, as for the autograd reference; cuDNN
has no logit soft-capping, so a RefProblem has none.

With `dropout_seed` set, dropout is simulated with torch's generator: the result is one sample of
what a correct kernel computes (its mask differs from cuDNN's), used to size an FP8 backward's gradient
scales; results under dropout are checked by what every correct mask's result shares: `dropout_moments`
(O), `gradient_moments` (dQ, dV) and `row_term_moments` (dK, dBias, dSink).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fusedattn_select.reference import gram_norms, semantics

# Elements of one chunk's (batch, group heads, rows, keys) score block: a few such float32 blocks
# are alive at once, so a chunk holds well under a gigabyte.
CHUNK_ELEMENTS = 1 << 25


@dataclass
class RefProblem:
    """One problem's inputs in logical (batch, heads, seqlen, head_dim) order, and its options.

    q (b, Hq, Sq, D), k (b, Hkv, Skv, D), v (b, Hkv, Skv, Dv): any dtype and strides. lens_q and
    lens_kv: (b,) lengths (the full extents without padding). bias: 4-D, broadcastable to
    (b, Hq, Sq, Skv). alibi: (Hq,) slopes. sink: (Hq,) for softmax "learnable".
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    lens_q: torch.Tensor
    lens_kv: torch.Tensor
    scale: float
    causal: bool = False
    bottom_right: bool = False
    left: int = -1
    right: int = -1
    bias: torch.Tensor | None = None
    alibi: torch.Tensor | None = None
    softmax: str = "vanilla"
    sink: torch.Tensor | None = None
    dropout: float = 0.0
    dropout_seed: int | None = None

    @property
    def group(self) -> int:
        return self.q.shape[1] // self.k.shape[1]

    def chunk_rows(self) -> int:
        b, skv = self.q.shape[0], self.k.shape[2]
        return max(1, min(self.q.shape[2], CHUNK_ELEMENTS // max(1, b * self.group * skv)))


@dataclass
class Chunk:
    """Softmax probabilities of one chunk of query rows of one KV group."""

    p: torch.Tensor          # (b, G, c, Skv) float32, 0 on masked keys and padded rows
    lse: torch.Tensor        # (b, G, c) natural log-sum-exp (with the extra logit)
    rows_ok: torch.Tensor    # (b, 1, c) bool: a real query row that sees at least one key
    keep: torch.Tensor | None  # (b, G, c, Skv) simulated dropout scale (0 or 1/(1-p)), or None


def _chunk(ref: RefProblem, kv_head: int, start: int, stop: int) -> Chunk:
    g = ref.group
    heads = slice(kv_head * g, (kv_head + 1) * g)
    where = semantics.positions(start, stop, ref.k.shape[2], ref.lens_q, ref.lens_kv, ref.bottom_right)
    seen = semantics.visible(where, ref.lens_kv, ref.causal, ref.left, ref.right)
    bias = ref.bias
    if bias is not None:
        bias = bias[..., start:stop, :]
        bias = (bias if bias.shape[1] == 1 else bias[:, heads]).float()
    slopes = None if ref.alibi is None else ref.alibi[heads].view(1, g, 1, 1).float()
    masked = semantics.logits(ref.q[:, heads, start:stop].float(), ref.k[:, kv_head].float().unsqueeze(1),
                              ref.scale, where, seen, bias=bias, slopes=slopes)
    sink = None if ref.sink is None else ref.sink[heads].float()
    softmaxed = semantics.softmax(masked, ref.softmax, sink)
    keep = None
    if ref.dropout > 0.0 and ref.dropout_seed is not None:
        generator = torch.Generator(device=ref.q.device)
        generator.manual_seed(ref.dropout_seed + 1_000_003 * kv_head + start)
        draw = torch.rand(softmaxed.probs.shape, generator=generator, device=ref.q.device)
        keep = (draw >= ref.dropout).float() / (1.0 - ref.dropout)
    return Chunk(softmaxed.probs, softmaxed.lse.squeeze(-1), seen.any(dim=-1), keep)


def _chunks(ref: RefProblem):
    """(kv head, heads slice, start, stop, Chunk) over every chunk of query rows of every KV group."""
    rows, g = ref.chunk_rows(), ref.group
    for kv_head in range(ref.k.shape[1]):
        for start in range(0, ref.q.shape[2], rows):
            stop = min(start + rows, ref.q.shape[2])
            yield kv_head, slice(kv_head * g, (kv_head + 1) * g), start, stop, _chunk(ref, kv_head, start, stop)


def forward(ref: RefProblem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output (b, Hq, Sq, Dv), log-sum-exp (b, Hq, Sq), rows_ok (b, 1, Sq)), all float32 but rows_ok.

    Output rows that see no key, and padded rows, are 0; rows_ok says which rows are neither.
    """
    b, hq, sq = ref.q.shape[:3]
    out = torch.zeros((b, hq, sq, ref.v.shape[3]), dtype=torch.float32, device=ref.q.device)
    lse = torch.zeros((b, hq, sq), dtype=torch.float32, device=ref.q.device)
    rows_ok = torch.zeros((b, 1, sq), dtype=torch.bool, device=ref.q.device)
    for kv_head, heads, start, stop, chunk in _chunks(ref):
        p = chunk.p if chunk.keep is None else chunk.p * chunk.keep
        out[:, heads, start:stop] = torch.matmul(p, ref.v[:, kv_head].float().unsqueeze(1))
        lse[:, heads, start:stop] = chunk.lse
        rows_ok[:, :, start:stop] = chunk.rows_ok
    return out, lse, rows_ok


@dataclass
class DropoutMoments:
    """What every correct kernel's result under dropout has in common, whatever its mask (per element
    or per unit; docs/verify.md, 'Dropout'). The fields as dropout_moments fills them for O (float32;
    gradient_moments fills them for dQ and dV, in float64, with their own terms): with P the dropout-free
    probabilities, V the values, O the dropout-free output and w_ij = O_i . V_j,

    - spread (b, Hq, Sq, Dv): sum_j P_ij^2 V_jd^2; times p/(1-p), the expected squared distance of O_d
      from the reference;
    - weights (b, Hq, Sq): sum_j P_ij^4 |V_j|^4 = sum_j G_jj^2, the kurtosis term of the variance of a row's
      distance, G_jl = P_ij P_il V_j . V_l being the Gram matrix of the row's terms;
    - reach (b, Hq, Sq): sum_d (sum_j P_ij |V_jd|)^2, the largest squared distance a row can reach;
    - slope_spread (b, Hq, Sq): sum_j P_ij^2 w_ij^2; times p/(1-p), the variance of (O_got - O) . O;
    - slope_reach (b, Hq, Sq): sum_j P_ij |w_ij|, the largest |(O_got - O) . O| a row can reach;
    - gram (b, Hq, Sq): ||G||_F^2 = sum_{j,l} G_jl^2, with weights the exact variance of a row's distance.
    """

    spread: torch.Tensor
    weights: torch.Tensor
    reach: torch.Tensor
    slope_spread: torch.Tensor
    slope_reach: torch.Tensor
    gram: torch.Tensor
    # (b, Hq, Sq) or None: a size each unit's result moves by, times the roundoff, through a rounding its
    # kernel makes beyond its own result's (dQ: the row term dO_i . O_i read from a rounded O).
    rounded: torch.Tensor | None = None


def _zero_moments(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype = torch.float64) -> DropoutMoments:
    """DropoutMoments of zeros for results of `shape` (one unit per last-dim row)."""
    def zeros(size: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros(size, dtype=dtype, device=device)

    return DropoutMoments(zeros(shape), *(zeros(shape[:-1]) for _ in range(5)))


def _row_gram(w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """gram_norms.cross_gram of a chunk's query rows (w (b, G, c, Skv)) over the keys' vectors y (b, 1, Skv, D)."""
    b, g, c, skv = w.shape
    flat, vectors = w.reshape(b, g * c, skv), y.squeeze(1)
    return gram_norms.cross_gram(flat, vectors, flat, vectors, CHUNK_ELEMENTS).reshape(b, g, c)


def _key_gram(plain: RefProblem, kv_head: int, terms) -> torch.Tensor:
    """(b, Skv): each key's ||G||_F^2 over every query row of the KV group, `terms(chunk, heads, start, stop)`
    giving a chunk's (w (b, G, c, Skv), y (b, G, c, D)) (a term of key j and row i: sqrt(w_ij) y_i)."""
    b, skv, rows = plain.q.shape[0], plain.k.shape[2], plain.chunk_rows()
    heads = slice(kv_head * plain.group, (kv_head + 1) * plain.group)
    spans = [(start, min(start + rows, plain.q.shape[2])) for start in range(0, plain.q.shape[2], rows)]

    def made(span: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        w, y = terms(_chunk(plain, kv_head, *span), heads, *span)
        return w.permute(0, 3, 1, 2).reshape(b, skv, -1), y.reshape(b, -1, y.shape[-1])

    return gram_norms.over_chunks(spans, made, CHUNK_ELEMENTS)


def dropout_moments(ref: RefProblem, out: torch.Tensor) -> DropoutMoments:
    """The DropoutMoments of `ref` (its dropout not simulated), `out` being forward(ref)'s output."""
    plain = dataclasses.replace(ref, dropout_seed=None)
    moments = _zero_moments(tuple(out.shape), out.device, torch.float32)
    for kv_head, heads, start, stop, chunk in _chunks(plain):
        p = chunk.p
        v = ref.v[:, kv_head].float().unsqueeze(1)
        squared = p * p
        moments.spread[:, heads, start:stop] = torch.matmul(squared, v * v)
        moments.weights[:, heads, start:stop] = (squared * (v * v).sum(-1).unsqueeze(-2)).square().sum(-1)
        moments.reach[:, heads, start:stop] = torch.matmul(p, v.abs()).square().sum(-1)
        w = torch.matmul(out[:, heads, start:stop], v.transpose(-1, -2))
        moments.slope_spread[:, heads, start:stop] = (squared * w * w).sum(-1)
        moments.slope_reach[:, heads, start:stop] = (p * w.abs()).sum(-1)
        moments.gram[:, heads, start:stop] = _row_gram(squared, v)
    return moments


def gradient_moments(ref: RefProblem, grad_out: torch.Tensor, grads: "Gradients", out: torch.Tensor | None = None
                     ) -> tuple[DropoutMoments, DropoutMoments]:
    """The DropoutMoments of dQ (one unit per query row) and of dV (one per key and KV head) of `ref`
    (`grads` its dropout-free backward(ref, grad_out)), both linear in the dropout decisions: with
    a_ij = P_ij dO_i . V_j and K'_j = K_j - sum_l P_il K_l, dQ_i moves by scale sum_j e_ij a_ij K'_j and
    dV_j by sum_i e_ij P_ij dO_i (e_ij = m_ij / (1-p) - 1). dK: row_term_moments.
    `out`: the O the backward reads (the forward's, rounded to its dtype): its rounding moves the row term
    D_i = dO_i . O_i and so dQ_i by scale |K_bar_i| |dO_i| . |O_i| per roundoff (dQ's `rounded`)."""
    plain = dataclasses.replace(ref, dropout_seed=None)
    device, scale = grad_out.device, ref.scale
    dq, dv = _zero_moments(tuple(ref.q.shape), device), _zero_moments(tuple(ref.v.shape), device)
    if out is not None:
        dq.rounded = torch.zeros(ref.q.shape[:3], dtype=torch.float64, device=device)
    reach_v = torch.zeros(ref.v.shape, dtype=torch.float64, device=device)  # squared over d once summed
    for kv_head, heads, start, stop, chunk in _chunks(plain):
        # float64: dQ's terms are differences of near values (K_j - K_bar_i, expanded), float32's noise there
        # would outweigh the spread of rows that see few keys.
        p = chunk.p.double()
        k, v = ref.k[:, kv_head].double().unsqueeze(1), ref.v[:, kv_head].double().unsqueeze(1)
        d_o = grad_out[:, heads, start:stop].double()
        a = p * torch.matmul(d_o, v.transpose(-1, -2))
        a2, k_bar = a * a, torch.matmul(p, k)
        rows = (slice(None), heads, slice(start, stop))
        dq.spread[rows] = scale ** 2 * (torch.matmul(a2, k * k) - 2 * k_bar * torch.matmul(a2, k)
                                       + k_bar * k_bar * a2.sum(-1, keepdim=True))
        apart = ((k * k).sum(-1).unsqueeze(-2) - 2 * torch.matmul(k_bar, k.transpose(-1, -2))
                 + (k_bar * k_bar).sum(-1, keepdim=True))  # |K_j - K_bar_i|^2
        dq.weights[rows] = scale ** 4 * (a2 * apart).square().sum(-1)
        dq.reach[rows] = scale ** 2 * (torch.matmul(a.abs(), k.abs()) + k_bar.abs() * a.abs().sum(-1, keepdim=True)
                                       ).square().sum(-1)  # (an upper bound of what a mask reaches)
        dq_want = grads.dq[rows].double()
        w = scale * (torch.matmul(dq_want, k.transpose(-1, -2)) - (k_bar * dq_want).sum(-1, keepdim=True))
        dq.slope_spread[rows] = (a2 * w * w).sum(-1)
        dq.slope_reach[rows] = (a.abs() * w.abs()).sum(-1)
        dq.gram[rows] = scale ** 4 * _centred_gram(a2, k, k_bar)
        if dq.rounded is not None:
            read = out[rows].double().nan_to_num(0.0).abs()  # (rows that see no key may hold NaN: left out later)
            dq.rounded[rows] = abs(scale) * k_bar.norm(dim=-1) * (d_o.abs() * read).sum(-1)
        squared = p * p
        dv.spread[:, kv_head] += torch.matmul(squared.transpose(-1, -2), d_o * d_o).sum(1)
        dv.weights[:, kv_head] += (squared * (d_o * d_o).sum(-1, keepdim=True)).square().sum((1, 2))
        reach_v[:, kv_head] += torch.matmul(p.transpose(-1, -2), d_o.abs()).sum(1)
        w = torch.matmul(d_o, grads.dv[:, kv_head].double().unsqueeze(1).transpose(-1, -2))
        dv.slope_spread[:, kv_head] += (squared * w * w).sum((1, 2))
        dv.slope_reach[:, kv_head] += (p * w.abs()).sum((1, 2))
    dv.reach.copy_(reach_v.square().sum(-1))
    for kv_head in range(ref.k.shape[1]):
        dv.gram[:, kv_head] = _key_gram(plain, kv_head, lambda chunk, heads, start, stop: (
            chunk.p.double().square(), grad_out[:, heads, start:stop].double()))
    return dq, dv


def _centred_gram(w: torch.Tensor, k: torch.Tensor, k_bar: torch.Tensor) -> torch.Tensor:
    """Per query row: ||M||_F^2 of M = sum_j w_j (K_j - K_bar)(K_j - K_bar)^T (w (b, G, c, Skv), k (b, 1, Skv, D),
    k_bar (b, G, c, D)): with A = sum_j w_j K_j K_j^T and m = sum_j w_j K_j, M = A - K_bar m^T - m K_bar^T
    + (sum_j w_j) K_bar K_bar^T, whose norm expands into ||A||_F^2 (gram_norms) and sums over keys."""
    m = torch.matmul(w, k)
    k_bar_k, m_k = torch.matmul(k_bar, k.transpose(-1, -2)), torch.matmul(m, k.transpose(-1, -2))
    total, kk, mm, km = w.sum(-1), (k_bar * k_bar).sum(-1), (m * m).sum(-1), (k_bar * m).sum(-1)
    found = (_row_gram(w, k) + 2.0 * (kk * mm + km * km) + total * total * kk * kk
             - 4.0 * (w * k_bar_k * m_k).sum(-1) + 2.0 * total * (w * k_bar_k * k_bar_k).sum(-1)
             - 4.0 * total * km * kk)
    return found.clamp_min(0.0)


@dataclass
class Gradients:
    """The reference gradients (float32): dQ, dK, dV; dBias for a (1, Hq, Sq, Skv) bias; dSink; and
    rows_ok (b, 1, Sq), the query rows that are real and see at least one key."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    rows_ok: torch.Tensor
    dbias: torch.Tensor | None = None
    dsink: torch.Tensor | None = None


def backward(ref: RefProblem, grad_out: torch.Tensor, bias_grad: bool = False) -> Gradients:
    """The gradients of sum(output * grad_out) with respect to q, k, v (and the bias, the sink).

    grad_out: (b, Hq, Sq, Dv). `bias_grad`: also the gradient of a (1, Hq, Sq, Skv) bias.
    """
    b, hq, sq = ref.q.shape[:3]
    skv = ref.k.shape[2]
    device = ref.q.device
    grads = Gradients(torch.zeros(ref.q.shape, dtype=torch.float32, device=device),
                      torch.zeros(ref.k.shape, dtype=torch.float32, device=device),
                      torch.zeros(ref.v.shape, dtype=torch.float32, device=device),
                      torch.zeros((b, 1, sq), dtype=torch.bool, device=device))
    if bias_grad:
        grads.dbias = torch.zeros((1, hq, sq, skv), dtype=torch.float32, device=device)
    if ref.softmax == "learnable":
        grads.dsink = torch.zeros((hq,), dtype=torch.float32, device=device)
    for kv_head, heads, start, stop, chunk in _chunks(ref):
        q = ref.q[:, heads, start:stop].float()
        k = ref.k[:, kv_head].float().unsqueeze(1)
        v = ref.v[:, kv_head].float().unsqueeze(1)
        d_o = grad_out[:, heads, start:stop].float()
        dropped = chunk.p if chunk.keep is None else chunk.p * chunk.keep
        # The softmax backward's row term: sum_j P_ij dP_ij, which is dO_i . O_i.
        row_term = (d_o * torch.matmul(dropped, v)).sum(dim=-1, keepdim=True)
        d_p = torch.matmul(d_o, v.transpose(-1, -2))
        if chunk.keep is not None:
            d_p = d_p * chunk.keep
        d_s = chunk.p * (d_p - row_term)
        grads.dq[:, heads, start:stop] = torch.matmul(d_s, k) * ref.scale
        grads.dk[:, kv_head] += (torch.matmul(d_s.transpose(-1, -2), q) * ref.scale).sum(dim=1)
        grads.dv[:, kv_head] += torch.matmul(dropped.transpose(-1, -2), d_o).sum(dim=1)
        grads.rows_ok[:, :, start:stop] = chunk.rows_ok
        if grads.dbias is not None:
            grads.dbias[0, heads, start:stop] += d_s.sum(dim=0)
        if grads.dsink is not None:
            # The extra logit's probability times (its dP of 0 minus the row term).
            p_sink = torch.exp(ref.sink[heads].float().view(1, -1, 1) - chunk.lse)
            grads.dsink[heads] -= (p_sink * row_term.squeeze(-1)).sum(dim=(0, 2))
    return grads


@dataclass
class RowTermMoments:
    """What removes the row term from dK, dBias and dSink under dropout, and dK's and dBias's moments
    (docs/verify.md, 'Dropout'). With e_ij = m_ij / (1-p) - 1, a_ij = P_ij dO_i . V_j and
    c_i = dO_i . (O_i - O_ref_i), the change of the kernel's row term D_i = dO_i . O_i that its own O shows:
    dK_j moves by scale sum_i (e_ij a_ij - P_ij c_i) Q_i, dBias_ij by e_ij a_ij - P_ij c_i (summed over the
    batch), dSink_h by -sum_i p_sink_i c_i. The `*_shift` fields are the c terms (what the O the kernel
    wrote fixes); what is left is linear in decisions independent across keys (dK, one unit per key and KV
    head) and across elements (dBias, one unit per query row of a head), as O's across rows.
    """

    dk: DropoutMoments
    dk_shift: torch.Tensor                 # (b, Hkv, Skv, D)
    dbias: DropoutMoments | None = None
    dbias_shift: torch.Tensor | None = None  # (1, Hq, Sq, Skv)
    dsink_shift: torch.Tensor | None = None  # (Hq,)


def row_term_moments(ref: RefProblem, grad_out: torch.Tensor, grads: Gradients, out: torch.Tensor
                     ) -> RowTermMoments:
    """The RowTermMoments of `ref` (`grads` its dropout-free backward(ref, grad_out)), `out` the O the
    backward reads (the forward's under the same mask, rounded to its dtype: the kernel's row term is
    dO_i . out_i, so c_i is taken from it). `rounded` (dK's, dBias's) bounds what c_i moves by per roundoff
    where a kernel rounds O otherwise: |dO_i| . |out_i| per row, twice in compare_under_dropout."""
    plain = dataclasses.replace(ref, dropout_seed=None)
    device, scale = grad_out.device, ref.scale
    found = RowTermMoments(_zero_moments(tuple(ref.k.shape), device),
                           torch.zeros(ref.k.shape, dtype=torch.float64, device=device))
    found.dk.rounded = torch.zeros(ref.k.shape[:3], dtype=torch.float64, device=device)
    reach_k = torch.zeros(ref.k.shape, dtype=torch.float64, device=device)  # squared over d once summed
    if grads.dbias is not None:  # (float32: two more tensors of the bias's size, as the reference's own dBias)
        found.dbias = _zero_moments(tuple(grads.dbias.shape), device, torch.float32)
        found.dbias.rounded = torch.zeros(grads.dbias.shape[:3], dtype=torch.float32, device=device)
        found.dbias_shift = torch.zeros(grads.dbias.shape, dtype=torch.float32, device=device)
    if grads.dsink is not None:
        found.dsink_shift = torch.zeros(grads.dsink.shape, dtype=torch.float64, device=device)
    for kv_head, heads, start, stop, chunk in _chunks(plain):
        p = chunk.p.double()
        q, v = ref.q[:, heads, start:stop].double(), ref.v[:, kv_head].double().unsqueeze(1)
        d_o = grad_out[:, heads, start:stop].double()
        read = out[:, heads, start:stop].double().nan_to_num(0.0) * chunk.rows_ok.unsqueeze(-1)  # no-key rows: NaN
        c = (d_o * (read - torch.matmul(p, v))).sum(-1, keepdim=True)  # (b, G, c, 1)
        a = p * torch.matmul(d_o, v.transpose(-1, -2))
        a2, q2 = a * a, q * q
        found.dk_shift[:, kv_head] -= scale * torch.matmul((p * c).transpose(-1, -2), q).sum(1)
        found.dk.spread[:, kv_head] += scale ** 2 * torch.matmul(a2.transpose(-1, -2), q2).sum(1)
        found.dk.weights[:, kv_head] += scale ** 4 * (a2 * q2.sum(-1, keepdim=True)).square().sum((1, 2))
        reach_k[:, kv_head] += abs(scale) * torch.matmul(a.abs().transpose(-1, -2), q.abs()).sum(1)
        w = scale * torch.matmul(q, grads.dk[:, kv_head].double().unsqueeze(1).transpose(-1, -2))  # Q_i . dK_j
        found.dk.slope_spread[:, kv_head] += (a2 * w * w).sum((1, 2))
        found.dk.slope_reach[:, kv_head] += (a.abs() * w.abs()).sum((1, 2))
        moved = (d_o.abs() * read.abs()).sum(-1, keepdim=True)  # what c_i moves by per roundoff of O
        found.dk.rounded[:, kv_head] += abs(scale) * torch.matmul(p.transpose(-1, -2), q.norm(dim=-1, keepdim=True)
                                                                  * moved).squeeze(-1).sum(1)
        if found.dbias is not None:
            _dbias_moments(found, grads, heads, start, stop, p, a, c, moved)
        if found.dsink_shift is not None:
            p_sink = torch.exp(ref.sink[heads].double().view(1, -1, 1) - chunk.lse.double())
            found.dsink_shift[heads] -= (p_sink * c.squeeze(-1)).sum((0, 2))
    found.dk.reach.copy_(reach_k.square().sum(-1))
    for kv_head in range(ref.k.shape[1]):
        found.dk.gram[:, kv_head] = scale ** 4 * _key_gram(plain, kv_head, lambda chunk, heads, start, stop: (
            (chunk.p.double() * torch.matmul(grad_out[:, heads, start:stop].double(),
                                             ref.v[:, kv_head].double().unsqueeze(1).transpose(-1, -2))).square(),
            ref.q[:, heads, start:stop].double()))
    return found


def _dbias_moments(found: RowTermMoments, grads: Gradients, heads: slice, start: int, stop: int, p: torch.Tensor,
                   a: torch.Tensor, c: torch.Tensor, moved: torch.Tensor) -> None:
    """dBias's share of a chunk (a (1, Hq, Sq, Skv) bias: each element sums its decisions over the batch)."""
    rows = (0, heads, slice(start, stop))
    a2 = a * a
    want = grads.dbias[rows].double()
    found.dbias_shift[rows] -= (p * c).sum(0)
    found.dbias.spread[rows] = a2.sum(0)
    found.dbias.weights[rows] = a2.square().sum((0, -1))
    found.dbias.gram[rows] = a2.sum(0).square().sum(-1)  # a term (b, j) lies along the result's element j
    found.dbias.reach[rows] = a.abs().sum(0).square().sum(-1)
    found.dbias.slope_spread[rows] = (a2 * want * want).sum((0, -1))
    found.dbias.slope_reach[rows] = (a.abs() * want.abs()).sum((0, -1))
    found.dbias.rounded[rows] = (p * moved).sum(0).norm(dim=-1)
