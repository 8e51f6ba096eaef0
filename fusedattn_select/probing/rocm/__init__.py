"""ROCm: device facts (hip-python, KFD sysfs) and verdicts from declared capability tables."""

from __future__ import annotations

from fusedattn_select.probing.rocm.rocm_device import (
    RocmDeviceFacts,
    RocmGpu,
    detect_rocm_device,
    gfx_arch_from_target_version,
)
from fusedattn_select.probing.rocm.rocm_engine import DeclaredRocmEngine, HipdnnGraphSteps, select_rocm_engine
from fusedattn_select.probing.rocm.tables import TABLE_NAMES, DeclaredTable, load_table

__all__ = [
    "DeclaredRocmEngine", "DeclaredTable", "HipdnnGraphSteps", "RocmDeviceFacts", "RocmGpu",
    "TABLE_NAMES", "detect_rocm_device", "gfx_arch_from_target_version", "load_table",
    "select_rocm_engine",
]
