"""What the installed torch can do, for the tests that need more than the oldest torch supported
(docs/gpu-tests.md, 'Supported versions'). Nothing here imports torch before a test asks."""

from __future__ import annotations

import functools

import pytest


def version() -> tuple[int, int]:
    import torch

    return tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])  # type: ignore[return-value]


@functools.cache
def cpu_flash_takes_grouped_kv() -> bool:
    """Whether SDPA pinned to its flash kernel runs grouped KV heads on the CPU (the first-contact
    tools' "flash" side does, with FIRST_CONTACT_DEVICE=cpu)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 1, 4, 8)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    except RuntimeError:
        return False
    return True


def need_cpu_flash_with_grouped_kv() -> None:
    if not cpu_flash_takes_grouped_kv():
        pytest.skip("this torch's CPU flash kernel takes no grouped KV heads (so on torch 2.5 and 2.6)")


def need_torch(least: tuple[int, int], why: str) -> None:
    if version() < least:
        pytest.skip(f"needs torch {least[0]}.{least[1]} or later: {why}")
