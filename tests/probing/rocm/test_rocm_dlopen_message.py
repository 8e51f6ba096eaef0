"""The ROCm line of `info` names the HIP library plainly: hip-python builds its dlopen error from bytes
(f"failed to dlopen '{str(path)}': {str(reason)}", hip/_util/posixloader.pyx), which read
"'b'libamdhip64.so''"; the detail shows the text inside them."""

from __future__ import annotations

import ctypes
import sys
import types

import pytest

from fusedattn_select.probing.rocm import rocm_device
from fusedattn_select.probing.rocm.rocm_device import NO_HIP_RUNTIME, detect_rocm_device

PLAIN = ("failed to dlopen 'libamdhip64.so': libamdhip64.so: cannot open shared object file: "
         "No such file or directory")


def hip_python_dlopen_error(path: bytes, reason: bytes) -> RuntimeError:
    """The RuntimeError hip-python's posixloader raises where dlopen fails (its message built the same way)."""
    return RuntimeError(f"failed to dlopen '{str(path)}': {str(reason)}")


def fake_hip_package(monkeypatch, error: RuntimeError) -> None:
    """hip-python whose first HIP call raises `error`, as the real one does without a HIP runtime."""
    def fail(*_args):
        raise error
    hip = types.SimpleNamespace(hipGetDeviceCount=fail, hipRuntimeGetVersion=fail, hipDriverGetVersion=fail)
    package = types.ModuleType("hip")
    package.hip = hip
    package.VERSION, package.ROCM_VERSION_NAME = "7.2.2", "7.2.2"
    monkeypatch.setitem(sys.modules, "hip", package)


@pytest.mark.parametrize("reason, plain_reason", [
    (b"libamdhip64.so: cannot open shared object file: No such file or directory",
     "libamdhip64.so: cannot open shared object file: No such file or directory"),
    (b"libamdhip64.so: can't open: it's gone", "libamdhip64.so: can't open: it's gone"),  # repr in double quotes
])
def test_the_dlopen_detail_names_the_library_without_a_bytes_repr(monkeypatch, tmp_path, reason, plain_reason):
    fake_hip_package(monkeypatch, hip_python_dlopen_error(b"libamdhip64.so", reason))
    facts = detect_rocm_device(sysfs_root=tmp_path, rocm_root=tmp_path)
    assert facts.reason == NO_HIP_RUNTIME
    assert facts.detail.startswith(f"failed to dlopen 'libamdhip64.so': {plain_reason}; no KFD topology at ")
    assert "b'" not in facts.describe() and 'b"' not in facts.describe()


def test_text_that_only_looks_like_a_bytes_repr_is_kept():
    assert rocm_device.plain_hip_message("a verb'x' and lib'b' stay") == "a verb'x' and lib'b' stay"


def test_the_real_hip_python_without_a_runtime_gives_a_plain_library_name(tmp_path):
    pytest.importorskip("hip")
    try:
        ctypes.CDLL("libamdhip64.so")
        pytest.skip("a HIP runtime is installed here: the no-runtime path cannot happen")
    except OSError:
        pass
    facts = detect_rocm_device(sysfs_root=tmp_path, rocm_root=tmp_path)
    assert facts.detail.startswith("failed to dlopen 'libamdhip64.so': libamdhip64.so: ")
    assert "b'" not in facts.detail
