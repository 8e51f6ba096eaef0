"""Simulate the roundings of FP8 attention graphs on the CPU, to size depth verify's FP8 tolerance.

    python -m tools.simulate_fp8_tolerance            # the grid docs/verify.md quotes

The inputs are seeded normals quantized per tensor as dispatch quantizes them (a power-of-two scale
bringing the largest magnitude nearest below the type's top); the kernel is taken to compute the
scores exactly from those FP8 values. Forward: the unnormalized probabilities exp(S - rowmax) are
rounded to the inputs' type at dtypes.FP8_SOFTMAX_SCALE before P.V (as cudnn-frontend's FP8
reference does), normalized by the unrounded row sums, and O is rounded to its FP8 type at V's
scale. Backward (O, dO and the gradients in the inputs' FP8 type, as the delayed recipe runs it): P
rounded as in the forward for dV = P^T dO; dS = P (dO V^T - rowsum(dO O)) with O rounded, rounded
to e4m3 at the scale dispatch binds (dtypes.fp8_gradient_bounds, dtypes.FP8_INTERNAL_RANGE) for
dQ = s dS K and dK = s dS^T Q; each gradient rounded at the scale its bound gives. The error is
max |result - reference| / max |reference|, the reference computed in float64 from the same FP8
values, printed in unit roundoffs of the coarsest type (tolerances.py) next to the tolerance depth
verify applies.
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import torch

from fusedattn_select import dtypes
from fusedattn_select.probing.cudnn import tolerances

HEAD_DIMS, LENGTHS = (64, 128, 256), (128, 512, 1024)


def _quantized(x: torch.Tensor, dtype: str) -> tuple[torch.Tensor, float]:
    """(the real values of x's FP8 copy, its scale)."""
    scale = dtypes.fp8_scale(float(x.abs().max()), dtype)
    return (x * scale).to(dtypes.torch_dtype(dtype, torch)).double() / scale, scale


def _round(x: torch.Tensor, dtype: str, scale: float) -> torch.Tensor:
    return (x * scale).float().to(dtypes.torch_dtype(dtype, torch)).double() / scale


def _problem(dtype: str, head_dim: int, length: int, causal: bool, seed: int, batch: int, heads: int, count: int):
    """`count` quantized inputs (real values, scales) and the scores' mask."""
    generator = torch.Generator().manual_seed(seed)
    inputs = [_quantized(torch.randn(batch, heads, length, head_dim, generator=generator), dtype) for _ in range(count)]
    keep = torch.ones(length, length, dtype=torch.bool).tril() if causal else torch.ones(length, length, dtype=torch.bool)
    return inputs, keep


def relative_error(dtype: str, head_dim: int, length: int, causal: bool, seed: int = 0,
                   batch: int = 2, heads: int = 4) -> float:
    """max |O - reference| / max |reference| of one simulated forward with FP8 inputs and output."""
    ((q, _), (k, _), (v, v_scale)), keep = _problem(dtype, head_dim, length, causal, seed, batch, heads, 3)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(head_dim)).masked_fill(~keep, float("-inf"))
    reference = torch.softmax(scores, -1) @ v
    unnormalized = torch.exp(scores - scores.amax(-1, keepdim=True))
    rounded_p = _round(unnormalized, dtype, dtypes.FP8_SOFTMAX_SCALE)
    out = _round(rounded_p @ v / unnormalized.sum(-1, keepdim=True), dtype, v_scale)
    return float((out - reference).abs().max() / reference.abs().max())


def gradient_errors(dtype: str, head_dim: int, length: int, causal: bool, seed: int = 0,
                    batch: int = 2, heads: int = 4) -> dict[str, float]:
    """max |g - reference| / max |reference| of dQ, dK, dV of one simulated FP8 backward (see above)."""
    ((q, _), (k, _), (v, v_scale), (d_o, _)), keep = _problem(dtype, head_dim, length, causal, seed, batch, heads, 4)
    s = 1.0 / math.sqrt(head_dim)
    p = torch.softmax((s * q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf")), -1)
    o = p @ v
    dp = d_o @ v.transpose(-1, -2)
    d_s = p * (dp - (d_o * o).sum(-1, keepdim=True))
    reference = {"dQ": s * d_s @ k, "dK": s * d_s.transpose(-1, -2) @ q, "dV": p.transpose(-1, -2) @ d_o}
    bounds = dtypes.fp8_gradient_bounds(s, 1.0, length, float(q.abs().max()), float(k.abs().max()),
                                        float(d_o.abs().max()), float(d_o.norm(dim=-1).max()), float(v.norm(dim=-1).max()))
    rounded_o = _round(o, dtype, v_scale)
    rounded_ds = _round(p * (dp - (d_o * rounded_o).sum(-1, keepdim=True)), "fp8_e4m3",
                        dtypes.fp8_scale(bounds["dP"], "fp8_e4m3", dtypes.FP8_INTERNAL_RANGE))
    kernel = {"dQ": s * rounded_ds @ k, "dK": s * rounded_ds.transpose(-1, -2) @ q,
              "dV": _round(p, dtype, dtypes.FP8_SOFTMAX_SCALE).transpose(-1, -2) @ d_o}
    return {name: float((_round(kernel[name], dtype, dtypes.fp8_scale(bounds[name], dtype)) - want).abs().max()
                        / want.abs().max()) for name, want in reference.items()}


def main() -> int:
    grid = list(itertools.product(HEAD_DIMS, LENGTHS, (False, True)))
    for dtype in dtypes.FP8_DTYPES:
        roundoff = tolerances.UNIT_ROUNDOFF_FP8[dtype]
        tolerance = tolerances.fp8_tolerance(dtype, dtype) / roundoff
        errors = [relative_error(dtype, d, n, causal) / roundoff for d, n, causal in grid]
        print(f"{dtype}: O error {min(errors):.2f}-{max(errors):.2f} unit roundoffs over head dims {HEAD_DIMS}, "
              f"lengths {LENGTHS}, causal or not; tolerance {tolerance:.0f}")
        gradients = {(d, n, causal): gradient_errors(dtype, d, n, causal) for d, n, causal in grid}
        for name in ("dQ", "dK", "dV"):
            for causal in (False, True):
                cells = [f"{n}: {max(g[name] for (_, length, c), g in gradients.items() if length == n and c is causal) / roundoff:.2f}"
                         for n in LENGTHS]
                print(f"  {name} {'causal' if causal else 'no mask'}: largest error by length {', '.join(cells)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
