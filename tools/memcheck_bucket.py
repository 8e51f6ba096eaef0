"""One forward+backward through a bucket plan at a shape below its bucket, for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m tools.memcheck_bucket
    compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m tools.memcheck_bucket --decode

The bucket plans are built first (by a call at another shape of that bucket); then a call at a smaller
batch and sequence length runs through them with ragged offsets and sequence lengths, the unused
batch slots at length 0, and its gradients are computed. memcheck reports any out-of-bounds or
misaligned access by those kernels against the caller's (smaller) tensors. Prints the versions, the
plan form that ran and the plan builds the call counted; exit status 1 when the call did not run
through a bucket plan (nothing would have been checked). `--decode`: a decode step instead (one
query row, keys and values in BHSD memory, inference), which runs with its KV heads as batch.
"""

from __future__ import annotations

import argparse
import sys

# (batch, seqlen) of the call, below the bucket B=4 S=1024 that the warm-up shape (4, 1000) builds.
WARM, CALL = (4, 1000), (3, 777)
HEADS_Q, HEADS_KV, HEAD_DIM = 8, 2, 64


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mask", default="causal", help="the mask of both calls (default causal)")
    parser.add_argument("--decode", action="store_true", help="a decode step with BHSD keys and values")
    args = parser.parse_args(argv)
    if args.decode:
        return _decode()

    import cudnn
    import torch

    from fusedattn_select.runtime.dispatcher import dispatcher
    from fusedattn_select.runtime.api import attention, dispatch_info

    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} cuDNN {cudnn.backend_version()} "
          f"cudnn-frontend {cudnn.__version__}")

    def tensors(b: int, s: int) -> list[torch.Tensor]:
        return [torch.randn(b, s, h, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for h in (HEADS_Q, HEADS_KV, HEADS_KV)]

    q, k, v = tensors(*WARM)
    attention(q, k, v, mask=args.mask).sum().backward()  # builds the bucket plans
    torch.cuda.synchronize()
    builds = dispatch_info()["plan_builds"]
    q, k, v = tensors(*CALL)
    out = attention(q, k, v, mask=args.mask)
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    entry = list(dispatcher.entries.values())[-1]
    built = dispatch_info()["plan_builds"] - builds
    print(f"call b{CALL[0]} s{CALL[1]} h{HEADS_Q}/{HEADS_KV} d{HEAD_DIM} {args.mask}: fused={entry.fused} "
          f"bucketed={entry.bucketed} plan builds={built} form={entry.selection.plan_form if entry.selection else '-'}")
    print(f"finite: out {bool(out.isfinite().all())} dq {bool(q.grad.isfinite().all())} "
          f"dk {bool(k.grad.isfinite().all())} dv {bool(v.grad.isfinite().all())}")
    return 0 if entry.fused and entry.bucketed and built == 0 else 1


def _decode() -> int:
    """A decode step (b3, 777 keys) below the bucket a step of b4 with 1000 keys built."""
    import cudnn
    import torch

    from fusedattn_select.runtime.dispatcher import dispatcher
    from fusedattn_select.runtime.api import attention, dispatch_info

    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} cuDNN {cudnn.backend_version()} "
          f"cudnn-frontend {cudnn.__version__}")

    def tensors(b: int, skv: int) -> list[torch.Tensor]:
        return [torch.randn(b, h, s, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                for h, s in ((HEADS_Q, 1), (HEADS_KV, skv), (HEADS_KV, skv))]

    with torch.no_grad():
        attention(*tensors(*WARM), layout="bhsd")  # builds the bucket plans of the heads-as-batch problem
        torch.cuda.synchronize()
        builds = dispatch_info()["plan_builds"]
        q, k, v = tensors(*CALL)
        out = attention(q, k, v, layout="bhsd")
        torch.cuda.synchronize()
    built = dispatch_info()["plan_builds"] - builds
    entry = next(e for e in reversed(list(dispatcher.entries.values())) if e.heads is not None)
    inner = entry.heads.entry
    print(f"decode b{CALL[0]} s_kv {CALL[1]} h{HEADS_Q}/{HEADS_KV} d{HEAD_DIM}: heads as batch, inner "
          f"bucketed={inner.bucketed} lean={entry.lean is not None} plan builds={built} form={entry.selection.plan_form}")
    print(f"finite: out {bool(out.isfinite().all())}")
    return 0 if inner.bucketed and built == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
