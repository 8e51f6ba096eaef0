"""The one table of dtypes and the layout vocabulary."""

from __future__ import annotations

import pytest

from fusedattn_select import dtypes
from fusedattn_select.errors import ConfigError
from fusedattn_select.layouts import LAYOUTS, SEPARATE_LAYOUTS, format_strides


def test_every_config_dtype_has_torch_and_cudnn_names():
    assert dtypes.DTYPES == ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
    for name in dtypes.DTYPES:
        entry = dtypes.BY_NAME[name]
        assert entry.torch_name and entry.cudnn_name


def test_parse_accepts_aliases_and_rejects_others_naming_the_field():
    assert dtypes.parse("bfloat16") == "bf16"
    assert dtypes.parse("torch.float16") == "fp16"
    with pytest.raises(ConfigError, match=r"torch_dtype='float64': must be one of 'fp16', 'bf16'"):
        dtypes.parse("float64", "torch_dtype")


def test_torch_round_trip():
    torch = pytest.importorskip("torch")
    for name in dtypes.DTYPES:
        assert dtypes.from_torch(dtypes.torch_dtype(name, torch)) == name
    assert dtypes.from_torch(torch.float64) is None


def test_separate_layouts_are_known_layouts_of_separate_tensors():
    for name in SEPARATE_LAYOUTS:
        assert LAYOUTS[name].packing is None and not LAYOUTS[name].paged and not LAYOUTS[name].ragged


def test_strides_of_each_format():
    assert format_strides("bshd", 2, 4, 8, 16) == (8 * 4 * 16, 16, 4 * 16, 1)
    assert format_strides("sbhd", 2, 4, 8, 16) == (4 * 16, 16, 2 * 4 * 16, 1)
    assert format_strides("bhsd", 2, 4, 8, 16) == (4 * 8 * 16, 8 * 16, 16, 1)
    with pytest.raises(ConfigError):
        format_strides("bhsd", 2, 4, 8, 16, "3hd")


def test_a_cudnn_type_without_a_counterpart_is_named_in_the_error():
    with pytest.raises(ConfigError, match=r"data_type='DOUBLE': has no counterpart"):
        dtypes.from_cudnn("DOUBLE")
    assert dtypes.from_cudnn("data_type.BFLOAT16") == "bf16"
