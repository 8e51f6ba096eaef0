"""Simulate the roundings of an FP8 attention forward on the CPU, to size depth verify's FP8 tolerance.

    python -m tools.simulate_fp8_tolerance            # the grid docs/verify.md quotes

The inputs are seeded normals quantized per tensor as dispatch quantizes them (a power-of-two scale
bringing the largest magnitude nearest below the type's top); the kernel is taken to compute the
scores exactly from those FP8 values, round the unnormalized probabilities exp(S - rowmax) to the
inputs' type at dtypes.FP8_SOFTMAX_SCALE before P.V (as cudnn-frontend's FP8 reference does),
normalize by the unrounded row sums, and round O to its FP8 type at V's scale. The error is max |O - reference| / max |reference|, the reference computed in
float64 from the same FP8 values, printed in unit roundoffs of the coarsest type (tolerances.py)
next to the tolerance depth verify applies.
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


def relative_error(dtype: str, head_dim: int, length: int, causal: bool, seed: int = 0,
                   batch: int = 2, heads: int = 4) -> float:
    """max |O - reference| / max |reference| of one simulated forward with FP8 inputs and output."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, length, head_dim, generator=generator) for _ in range(3))
    (q, _), (k, _), (v, v_scale) = (_quantized(t, dtype) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
    if causal:
        scores = scores.masked_fill(~torch.ones(length, length, dtype=torch.bool).tril(), float("-inf"))
    reference = torch.softmax(scores, -1) @ v
    unnormalized = torch.exp(scores - scores.amax(-1, keepdim=True))
    scale_s = dtypes.FP8_SOFTMAX_SCALE
    rounded_p = (unnormalized.float() * scale_s).to(dtypes.torch_dtype(dtype, torch)).double() / scale_s
    out = rounded_p @ v / unnormalized.sum(-1, keepdim=True)
    out = (out.float() * v_scale).to(dtypes.torch_dtype(dtype, torch)).double() / v_scale
    return float((out - reference).abs().max() / reference.abs().max())


def main() -> int:
    for dtype in dtypes.FP8_DTYPES:
        roundoff = tolerances.UNIT_ROUNDOFF_FP8[dtype]
        errors = [relative_error(dtype, d, n, causal) / roundoff
                  for d, n, causal in itertools.product(HEAD_DIMS, LENGTHS, (False, True))]
        print(f"{dtype}: O error {min(errors):.2f}-{max(errors):.2f} unit roundoffs over head dims {HEAD_DIMS}, "
              f"lengths {LENGTHS}, causal or not; tolerance {tolerances.fp8_tolerance(dtype, dtype) / roundoff:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
