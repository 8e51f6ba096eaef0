"""ROCm device facts: the KFD sysfs fallback, the reasons for no live answer, hip-python's real error path."""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

import pytest

from fusedattn_select.probing.rocm import rocm_device
from fusedattn_select.probing.rocm.rocm_device import (
    NO_HIP_PYTHON,
    NO_HIP_RUNTIME,
    HipCallError,
    detect_rocm_device,
    gfx_arch_from_target_version,
    installed_rocm_version,
    kfd_gpus,
    split_arch,
)


def write_kfd_tree(root, nodes: dict[int, dict[str, int]]):
    for index, props in nodes.items():
        node = root / "class/kfd/kfd/topology/nodes" / str(index)
        node.mkdir(parents=True)
        lines = [f"{key} {value}" for key, value in props.items()]
        (node / "properties").write_text("\n".join(["name_is_not_a_number x", *lines]) + "\n")
    return root


CPU_NODE = {"cpu_cores_count": 96, "simd_count": 0, "gfx_target_version": 0}
MI300X_NODE = {"simd_count": 1216, "simd_per_cu": 4, "gfx_target_version": 90402, "vendor_id": 4098}


@pytest.mark.parametrize(
    "target, arch",
    [(90010, "gfx90a"), (90402, "gfx942"), (90500, "gfx950"), (110000, "gfx1100"), (120001, "gfx1201"), (110501, "gfx1151")],
)
def test_gfx_target_version_names_the_arch(target, arch):
    assert gfx_arch_from_target_version(target) == arch


def test_gcn_arch_name_is_split_from_its_feature_flags():
    assert split_arch("gfx942:sramecc+:xnack-") == ("gfx942", "sramecc+:xnack-")
    assert split_arch("gfx1100") == ("gfx1100", "")


def test_kfd_tree_lists_gpu_nodes_and_skips_cpu_nodes(tmp_path):
    root = write_kfd_tree(tmp_path, {0: CPU_NODE, 1: MI300X_NODE, 2: MI300X_NODE, 10: dict(MI300X_NODE, gfx_target_version=90010)})
    gpus, note = kfd_gpus(root)
    assert [(g.index, g.arch, g.compute_units) for g in gpus] == [(0, "gfx942", 304), (1, "gfx942", 304), (2, "gfx90a", 304)]
    assert "3 GPU node(s) of 4" in note


def test_missing_kfd_tree_says_the_driver_is_not_loaded(tmp_path):
    gpus, note = kfd_gpus(tmp_path)
    assert gpus == ()
    assert "amdgpu driver not loaded" in note


def test_without_hip_python_the_kfd_tree_answers_and_the_reason_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)  # makes `import hip` raise ImportError
    root = write_kfd_tree(tmp_path, {0: CPU_NODE, 1: MI300X_NODE})
    facts = detect_rocm_device(sysfs_root=root, rocm_root=tmp_path / "no-rocm")
    assert (facts.source, facts.reason, facts.archs) == ("kfd-sysfs", NO_HIP_PYTHON, ("gfx942",))
    assert not facts.live
    assert "not live: hip-python not installed" in facts.describe()


def test_a_missing_hip_python_names_the_extra_that_installs_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)
    facts = detect_rocm_device(sysfs_root=tmp_path, rocm_root=tmp_path)
    assert "pip install 'fusedattn-select[rocm]'" in facts.describe()
    # The extra is real: pyproject.toml's [rocm] extra installs hip-python.
    pyproject = (Path(__file__).resolve().parents[3] / "pyproject.toml").read_text()
    assert re.search(r'^rocm = \["hip-python', pyproject, re.MULTILINE)


def test_without_hip_python_or_gpu_nodes_there_is_no_device(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)
    facts = detect_rocm_device(sysfs_root=write_kfd_tree(tmp_path, {0: CPU_NODE}), rocm_root=tmp_path)
    assert (facts.source, facts.reason, facts.device_count) == ("none", NO_HIP_PYTHON, 0)
    assert facts.describe().startswith("none: hip-python not installed: pip install 'fusedattn-select[rocm]' (")


def test_installed_rocm_version_is_read_from_its_info_file(tmp_path):
    (tmp_path / ".info").mkdir()
    (tmp_path / ".info" / "version").write_text("6.4.1-120\n")
    assert installed_rocm_version(tmp_path) == "6.4.1-120"
    assert installed_rocm_version(tmp_path / "absent") == ""


def test_the_installed_rocm_release_is_described_beside_kfd_gpus(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)
    (tmp_path / "rocm" / ".info").mkdir(parents=True)
    (tmp_path / "rocm" / ".info" / "version").write_text("6.4.1-120\n")
    facts = detect_rocm_device(sysfs_root=write_kfd_tree(tmp_path, {1: MI300X_NODE}), rocm_root=tmp_path / "rocm")
    assert (facts.versions.rocm, facts.versions.hip_runtime, facts.versions.hip_python) == ("6.4.1-120", 0, "")
    assert facts.describe() == ("0: gfx942 (gfx942) [from kfd-sysfs], ROCm 6.4.1-120, not live: hip-python not "
                                "installed: pip install 'fusedattn-select[rocm]'")


def test_hip_runtime_version_is_formatted_like_hip_does():
    assert rocm_device.format_hip_version(60443484) == "6.4.43484"


# ----- the real hip-python, on a machine without a HIP runtime -------------------------------
def _hip_runtime_loadable() -> bool:
    try:
        ctypes.CDLL("libamdhip64.so")
    except OSError:
        return False
    return True


@pytest.fixture
def hip():
    pytest.importorskip("hip")
    if _hip_runtime_loadable():
        pytest.skip("a HIP runtime is installed here: the no-runtime path cannot happen")
    from hip import hip as hip_module

    return hip_module


def test_hip_python_without_a_runtime_reports_that_libamdhip64_did_not_load(hip, tmp_path):
    facts = detect_rocm_device(sysfs_root=tmp_path, rocm_root=tmp_path)
    assert facts.reason == NO_HIP_RUNTIME
    assert "libamdhip64.so" in facts.detail
    assert facts.versions.hip_python and facts.versions.hip_python_rocm


def test_device_properties_call_reaches_the_runtime_with_either_signature(hip):
    # 7.x takes (prop, device); 10.x takes (device) and raises TypeError for two arguments.
    with pytest.raises(RuntimeError, match="libamdhip64"):
        rocm_device._device_properties(hip, 0)


def test_a_hip_error_code_is_raised_not_returned(hip):
    with pytest.raises(HipCallError) as raised:
        rocm_device._checked(hip, "hipGetDeviceCount", (hip.hipError_t.hipErrorNoDevice, 7))
    assert (raised.value.code, raised.value.name) == (rocm_device.HIP_ERROR_NO_DEVICE, "hipErrorNoDevice")
    assert rocm_device._checked(hip, "hipGetDeviceCount", (hip.hipError_t.hipSuccess, 2)) == (2,)
