"""Squared Frobenius norms of the Gram matrices of dropout's per-decision terms, which the variance of a
unit's squared distance needs (docs/verify.md, 'Dropout').

A unit's result moves by sum_j e_j x_j under dropout (e_j independent), each term x_j = sqrt(w_j) y_j a weight
times a vector; the Gram matrix G_jl = x_j . x_l has ||G||_F^2 = sum_{j,l} w_j w_l (y_j . y_l)^2. It is summed
one of two ways, whichever does less work: over pairs of terms, with H = (y y^T) squared elementwise (n x m
per batch), or through the D x D matrix sum_j w_j y_j y_j^T (whose squared Frobenius norm it also is). Either
way the work is split so that no block holds more than `budget` elements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def cross_gram(w: torch.Tensor, y: torch.Tensor, w2: torch.Tensor, y2: torch.Tensor, budget: int) -> torch.Tensor:
    """Per unit u: sum_{j,l} w[:, u, j] w2[:, u, l] (y[:, j] . y2[:, l])^2, shape (B, U).

    w (B, U, n) and y (B, n, D); w2 (B, U, m) and y2 (B, m, D) (the same tensors for one unit's own norm)."""
    _, units, n = w.shape
    m, dim = w2.shape[-1], y.shape[-1]
    by_pairs = n * m * (units + dim)
    by_outer = (n + m) * units * dim * dim
    if by_pairs <= by_outer:
        return _by_pairs(w, y, w2, y2, budget)
    return _by_outer(w, y, w2, y2, budget)


def _by_pairs(w: torch.Tensor, y: torch.Tensor, w2: torch.Tensor, y2: torch.Tensor, budget: int) -> torch.Tensor:
    batch, units, n = w.shape
    found = w.new_zeros((batch, units))
    step = max(1, budget // max(1, batch * max(n, units)))
    for start in range(0, w2.shape[-1], step):
        stop = start + step
        paired = torch.matmul(y, y2[:, start:stop].transpose(-1, -2)).square()  # (B, n, block)
        found += (torch.matmul(w, paired) * w2[..., start:stop]).sum(-1)
    return found


def _outer_sums(w: torch.Tensor, y: torch.Tensor, budget: int) -> torch.Tensor:
    """sum_j w[:, u, j] y_j y_j^T flattened: (B, U, D * D)."""
    batch, units, n = w.shape
    dim = y.shape[-1]
    found = w.new_zeros((batch, units, dim * dim))
    step = max(1, budget // max(1, batch * dim * dim))
    for start in range(0, n, step):
        part = y[:, start:start + step]
        outer = (part.unsqueeze(-1) * part.unsqueeze(-2)).reshape(batch, -1, dim * dim)
        found += torch.matmul(w[..., start:start + step], outer)
    return found


def _by_outer(w: torch.Tensor, y: torch.Tensor, w2: torch.Tensor, y2: torch.Tensor, budget: int) -> torch.Tensor:
    batch, units, _ = w.shape
    dim = y.shape[-1]
    found = w.new_zeros((batch, units))
    same = w is w2 and y is y2
    step = max(1, budget // max(1, batch * dim * dim))
    for start in range(0, units, step):
        first = _outer_sums(w[:, start:start + step], y, budget)
        second = first if same else _outer_sums(w2[:, start:start + step], y2, budget)
        found[:, start:start + step] = (first * second).sum(-1)
    return found


def over_chunks(chunks: Sequence, terms: Callable, budget: int) -> torch.Tensor:
    """sum over every pair of chunks (a, b) of cross_gram(*terms(a), *terms(b)), each chunk's terms
    (w (B, U, n_chunk), y (B, n_chunk, D)): the norms of units whose terms come from many chunks (a key's
    over every query row). A chunk's terms are made again for each pair it is in, not kept."""
    found = None
    for index, first in enumerate(chunks):
        w, y = terms(first)
        part = cross_gram(w, y, w, y, budget)
        for second in chunks[index + 1:]:
            w2, y2 = terms(second)
            part = part + 2.0 * cross_gram(w, y, w2, y2, budget)
        found = part if found is None else found + part
    return found
