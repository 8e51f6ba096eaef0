"""Which CUDA device a torchrun rank uses: device LOCAL_RANK, or the one device it sees (CUDA_VISIBLE_DEVICES
set per rank); a rank that sees several devices, but fewer than LOCAL_RANK + 1, is a ConfigError naming
LOCAL_RANK before it joins. The device counts are set here (this machine has no GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from fusedattn_select.distributed.group import _local_device  # noqa: E402
from fusedattn_select.errors import ConfigError  # noqa: E402


def _devices(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(("count", "local_rank", "device"), [(0, 3, None), (8, 3, 3), (1, 3, 0), (1, 0, 0)])
def test_a_rank_uses_its_local_rank_or_the_one_device_it_sees(monkeypatch, count, local_rank, device):
    _devices(monkeypatch, count)
    assert _local_device(local_rank) == device


def test_a_rank_that_sees_too_few_devices_is_refused_naming_local_rank(monkeypatch):
    _devices(monkeypatch, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ConfigError) as err:
        _local_device(3)
    assert err.value.field == "LOCAL_RANK" and "below the 2 CUDA devices this process sees" in str(err.value)
    assert "CUDA_VISIBLE_DEVICES='0,1'" in str(err.value)
