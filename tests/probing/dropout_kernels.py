"""Dropout kernels emulated on CPU for the tests of verify's checks under dropout (test_verify_dropout_dk_cpu,
test_verify_dropout_exact_variance_cpu): each draws its own mask, rounds its results to bf16 and reads its
softmax row term from the bf16 O it wrote, as cuDNN's do; options plant the wrong kernels those tests refuse.
Importable because pytest puts this folder on sys.path (a name no other test folder uses)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fusedattn_select.reference import chunked_reference
from fusedattn_select.reference.chunked_reference import RefProblem


def problem(b: int, hq: int, hkv: int, sq: int, skv: int, d: int = 64, causal: bool = False, scale: float | None = None,
            bias: bool = False, sink: bool = False, p: float = 0.1, seed: int = 0) -> RefProblem:
    """A seeded problem under dropout `p` (with a (1, Hq, Sq, Skv) bias, a learnable sink where asked)."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, d, generator=generator)
    k, v = (torch.randn(b, hkv, skv, d, generator=generator) for _ in range(2))
    ref = RefProblem(q, k, v, torch.full((b,), sq), torch.full((b,), skv), d ** -0.5 if scale is None else scale,
                     causal=causal, dropout=p)
    if bias:
        ref.bias = torch.randn(1, hq, sq, skv, generator=generator)
    if sink:
        ref.softmax, ref.sink = "learnable", torch.randn(hq, generator=generator)
    return ref


def grad_out_of(ref: RefProblem) -> torch.Tensor:
    generator = torch.Generator().manual_seed(5)
    return torch.randn(ref.q.shape[:3] + (ref.v.shape[3],), generator=generator).to(torch.bfloat16).float()


@dataclass
class Written:
    """What a dropout kernel writes: O (its forward's), and its backward's dQ, dK, dV, dBias, dSink (bf16 values)."""

    out: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dbias: torch.Tensor
    dsink: torch.Tensor


def kernel(ref: RefProblem, grad_out: torch.Tensor, seed: int, *, dropout: float | None = None, rescale: bool = True,
           row_term: str = "read", backward_seed: int | None = None) -> Written:
    """A kernel with its own mask (`seed`) at `dropout` (None: the problem's): O rounded to bf16, then the backward
    (under `backward_seed`'s mask where given), kept values rescaled by 1/(1-p) (`rescale`), the row term from
    the O it reads ("read", as cuDNN) or from the dropout-free O ("plain": no dropout correction of the row term)."""
    dropout = ref.dropout if dropout is None else dropout
    forward = dataclasses.replace(ref, dropout=dropout, dropout_seed=seed)
    out = chunked_reference.forward(forward)[0].to(torch.bfloat16).float()
    backward = forward if backward_seed is None else dataclasses.replace(forward, dropout_seed=backward_seed)
    dq, dk, dv = torch.zeros(ref.q.shape), torch.zeros(ref.k.shape), torch.zeros(ref.v.shape)
    dbias = torch.zeros((1,) + ref.q.shape[1:3] + (ref.k.shape[2],))
    dsink = torch.zeros(ref.q.shape[1])
    for kv_head, heads, start, stop, chunk in chunked_reference._chunks(backward):
        q, k, v = ref.q[:, heads, start:stop], ref.k[:, kv_head].unsqueeze(1), ref.v[:, kv_head].unsqueeze(1)
        d_o = grad_out[:, heads, start:stop]
        o = out[:, heads, start:stop].nan_to_num(0.0) if row_term == "read" else torch.matmul(chunk.p, v)
        row = (d_o * o).sum(-1, keepdim=True)
        keep = chunk.keep if rescale else chunk.keep * (1.0 - dropout)
        d_s = chunk.p * (torch.matmul(d_o, v.transpose(-1, -2)) * keep - row)
        dq[:, heads, start:stop] = ref.scale * torch.matmul(d_s, k)
        dk[:, kv_head] += ref.scale * torch.matmul(d_s.transpose(-1, -2), q).sum(1)
        dv[:, kv_head] += torch.matmul((chunk.p * keep).transpose(-1, -2), d_o).sum(1)
        dbias[0, heads, start:stop] += d_s.sum(0)
        if ref.sink is not None:
            p_sink = torch.exp(ref.sink[heads].view(1, -1, 1) - chunk.lse)
            dsink[heads] -= (p_sink * row.squeeze(-1)).sum((0, 2))
    rounded = (t.to(torch.bfloat16).float() for t in (dq, dk, dv, dbias, dsink))
    return Written(out, *rounded)
