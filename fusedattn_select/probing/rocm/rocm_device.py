"""ROCm device facts: GPUs and their gfx architecture, HIP runtime and ROCm versions.

hip-python answers when it is installed and the HIP runtime loads; otherwise the KFD topology in
sysfs still names the GPUs' architectures. Every HIP call's error code is checked: a failed call
returns garbage beside the error.
"""

from __future__ import annotations

import ast
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

log = logging.getLogger("fusedattn_select")

# The extra that installs hip-python (pyproject.toml [project.optional-dependencies] rocm), named where it is missing.
ROCM_EXTRA = "fusedattn-select[rocm]"
NO_HIP_PYTHON = f"hip-python not installed: pip install '{ROCM_EXTRA}'"
NO_HIP_RUNTIME = "no HIP runtime (libamdhip64.so could not be loaded)"
NO_AMD_GPU = "no AMD GPU"
HIP_ERROR = "HIP runtime error"

HIP_SUCCESS = 0
HIP_ERROR_NO_DEVICE = 100  # hipErrorNoDevice, the same in hip-python 6.x, 7.x and 10.x

KFD_NODES = Path("class/kfd/kfd/topology/nodes")
SYSFS_ROOT = Path("/sys")
ROCM_ROOT = Path("/opt/rocm")


@dataclass(frozen=True)
class RocmGpu:
    """One AMD GPU: its index, gfx architecture ("gfx942") and what else the source reports."""

    index: int
    arch: str
    arch_features: str = ""
    name: str = ""
    compute_units: int = 0


@dataclass(frozen=True)
class RocmVersions:
    """The HIP and ROCm versions beside the GPUs; 0 or "" where unknown.

    `hip_runtime` and `hip_driver` are HIP's integers (see format_hip_version), known only when
    hip-python answered; `rocm` is the installed release; `hip_python_rocm` is the ROCm release
    hip-python was built for, not the installed one.
    """

    hip_runtime: int = 0
    hip_driver: int = 0
    rocm: str = ""
    hip_python: str = ""
    hip_python_rocm: str = ""


@dataclass(frozen=True)
class RocmDeviceFacts:
    """What this machine says about AMD GPUs, where it was read from and why it is not live.

    `source` is "hip-python" (the live runtime answered), "kfd-sysfs" (hip-python could not, the
    kernel driver's topology did) or "none". `reason` is "" when hip-python answered, else one of
    NO_HIP_PYTHON, NO_HIP_RUNTIME, NO_AMD_GPU, HIP_ERROR; `detail` keeps the underlying text.
    """

    gpus: tuple[RocmGpu, ...] = ()
    source: str = "none"
    reason: str = ""
    detail: str = ""
    versions: RocmVersions = RocmVersions()

    @property
    def live(self) -> bool:
        return self.source == "hip-python" and not self.reason

    @property
    def device_count(self) -> int:
        return len(self.gpus)

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(gpu.arch for gpu in self.gpus))

    def describe(self) -> str:
        """One line for `info`: the GPUs and versions, or `none: <reason> (<detail>)`."""
        if not self.gpus:
            return f"none: {self.reason} ({self.detail})" if self.detail else f"none: {self.reason}"
        gpus = ", ".join(f"{gpu.index}: {gpu.name or gpu.arch} ({gpu.arch})" for gpu in self.gpus)
        parts = [f"{gpus} [from {self.source}]"]
        if self.versions.hip_runtime:
            parts.append(f"HIP runtime {format_hip_version(self.versions.hip_runtime)}")
        if self.versions.rocm:
            parts.append(f"ROCm {self.versions.rocm}")
        if self.reason:
            parts.append(f"not live: {self.reason}")
        return ", ".join(parts)


class HipCallError(Exception):
    """A HIP call returned an error code; `code` is the hipError_t value, `name` its name."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} returned {name} ({code})")
        self.call = call
        self.code = code
        self.name = name


def format_hip_version(version: int) -> str:
    """hipRuntimeGetVersion's integer as text: 60443484 -> "6.4.43484" (major*1e7 + minor*1e5 + patch)."""
    if version <= 0:
        return "unknown"
    return f"{version // 10_000_000}.{version // 100_000 % 100}.{version % 100_000}"


def gfx_arch_from_target_version(version: int) -> str:
    """KFD's gfx_target_version as a gfx name: 90402 -> "gfx942", 90010 -> "gfx90a", 110000 -> "gfx1100"."""
    major, minor, stepping = version // 10000, version // 100 % 100, version % 100
    return f"gfx{major}{minor:x}{stepping:x}"


def split_arch(gcn_arch_name: str) -> tuple[str, str]:
    """hipDeviceProp_t.gcnArchName split into the arch and its feature flags.

    "gfx942:sramecc+:xnack-" -> ("gfx942", "sramecc+:xnack-").
    """
    arch, _, features = gcn_arch_name.strip().partition(":")
    return arch, features


# ----- hip-python ----------------------------------------------------------------------------
def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).split(b"\0", 1)[0].decode(errors="replace")
    return str(value)


# A bytes repr inside a message: hip-python builds its dlopen error with str() of bytes.
_BYTES_REPR = re.compile(r"""(?<!\w)b('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")


def plain_hip_message(text: str) -> str:
    """`text` with each bytes repr in it (b'libamdhip64.so') replaced by the text it holds."""
    def plain(match: re.Match) -> str:
        try:
            return ast.literal_eval("b" + match.group(1)).decode(errors="replace")
        except (ValueError, SyntaxError):
            return match.group(0)
    return _BYTES_REPR.sub(plain, text)


def _checked(hip: Any, call: str, result: Any) -> tuple[Any, ...]:
    """The values a HIP call returned beside its error code; raises HipCallError on an error."""
    values = result if isinstance(result, tuple) else (result,)
    err = values[0]
    code = int(err)
    if code != HIP_SUCCESS:
        name = getattr(err, "name", "") or f"hipError {code}"
        raise HipCallError(call, code, name)
    return values[1:]


def _device_properties(hip: Any, device: int) -> Any:
    """hipDeviceProp_t of one device, for both of hip-python's call signatures."""
    props = hip.hipDeviceProp_t()
    try:
        # hip-python 6.x/7.x: hipGetDeviceProperties(prop, deviceId) -> (err,) and fills prop.
        result = hip.hipGetDeviceProperties(props, device)
    except TypeError:
        # hip-python 10.x: hipGetDeviceProperties(deviceId) -> (err, prop).
        (props,) = _checked(hip, "hipGetDeviceProperties", hip.hipGetDeviceProperties(device))
        return props
    _checked(hip, "hipGetDeviceProperties", result)
    return props


def _hip_gpus(hip: Any) -> tuple[RocmGpu, ...]:
    (count,) = _checked(hip, "hipGetDeviceCount", hip.hipGetDeviceCount())
    gpus = []
    for index in range(int(count)):
        props = _device_properties(hip, index)
        arch, features = split_arch(_text(props.gcnArchName))
        gpus.append(RocmGpu(index, arch, features, _text(props.name), int(props.multiProcessorCount)))
    return tuple(gpus)


def _hip_python_versions(hip_package: Any) -> RocmVersions:
    return RocmVersions(
        hip_python=str(getattr(hip_package, "VERSION", "")),
        hip_python_rocm=str(getattr(hip_package, "ROCM_VERSION_NAME", "")),
    )


def _read_with_hip_python() -> dict[str, Any]:
    """Facts from hip-python, or {"reason", "detail"} saying why there are none."""
    try:
        import hip as hip_package
        from hip import hip
    except ImportError as err:
        return {"reason": NO_HIP_PYTHON, "detail": str(err)}
    versions = _hip_python_versions(hip_package)
    try:
        gpus = _hip_gpus(hip)
        (runtime,) = _checked(hip, "hipRuntimeGetVersion", hip.hipRuntimeGetVersion())
        (driver,) = _checked(hip, "hipDriverGetVersion", hip.hipDriverGetVersion())
    except HipCallError as err:
        reason = NO_AMD_GPU if err.code == HIP_ERROR_NO_DEVICE else HIP_ERROR
        return {"reason": reason, "detail": str(err), "versions": versions}
    except RuntimeError as err:
        # hip-python loads libamdhip64.so on the first call and raises
        # RuntimeError("failed to dlopen 'b'libamdhip64.so'': ...") where there is none.
        return {"reason": NO_HIP_RUNTIME, "detail": plain_hip_message(str(err)), "versions": versions}
    if not gpus:
        return {"reason": NO_AMD_GPU, "detail": "hipGetDeviceCount returned 0", "versions": versions}
    versions = replace(versions, hip_runtime=int(runtime), hip_driver=int(driver))
    return {"gpus": gpus, "source": "hip-python", "versions": versions}


# ----- KFD sysfs -----------------------------------------------------------------------------
def _node_properties(path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in path.read_text().splitlines():
        key, _, value = line.strip().partition(" ")
        try:
            values[key] = int(value.strip())
        except ValueError:
            continue
    return values


def kfd_gpus(sysfs_root: Path = SYSFS_ROOT) -> tuple[tuple[RocmGpu, ...], str]:
    """GPUs in the KFD topology under `sysfs_root`, and a note on what was found.

    Nodes whose gfx_target_version is 0 are CPUs and are skipped.
    """
    nodes_dir = Path(sysfs_root) / KFD_NODES
    if not nodes_dir.is_dir():
        return (), f"no KFD topology at {nodes_dir} (amdgpu driver not loaded)"
    nodes = sorted((p for p in nodes_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    gpus = []
    for node in nodes:
        try:
            props = _node_properties(node / "properties")
        except OSError as err:
            log.debug("KFD node %s unreadable: %s", node, err)
            continue
        target = props.get("gfx_target_version", 0)
        if target == 0:
            continue
        simd_per_cu = props.get("simd_per_cu", 0)
        units = props.get("simd_count", 0) // simd_per_cu if simd_per_cu else 0
        gpus.append(RocmGpu(len(gpus), gfx_arch_from_target_version(target), compute_units=units))
    note = f"KFD topology at {nodes_dir}: {len(gpus)} GPU node(s) of {len(nodes)}"
    return tuple(gpus), note


def installed_rocm_version(rocm_root: Path = ROCM_ROOT) -> str:
    """The ROCm release installed under `rocm_root` (its .info/version), or ""."""
    try:
        return (Path(rocm_root) / ".info" / "version").read_text().strip()
    except OSError:
        return ""


def detect_rocm_device(sysfs_root: Path = SYSFS_ROOT, rocm_root: Path = ROCM_ROOT) -> RocmDeviceFacts:
    """This machine's AMD GPUs: from hip-python when it can answer, else from KFD sysfs."""
    found = _read_with_hip_python()
    versions = replace(found.pop("versions", RocmVersions()), rocm=installed_rocm_version(rocm_root))
    if not found.get("reason"):
        return RocmDeviceFacts(versions=versions, **found)
    gpus, note = kfd_gpus(sysfs_root)
    detail = f"{found['detail']}; {note}"
    log.debug("ROCm device facts not live: %s (%s)", found["reason"], detail)
    return RocmDeviceFacts(
        gpus=gpus,
        source="kfd-sysfs" if gpus else "none",
        reason=found["reason"],
        detail=detail,
        versions=versions,
    )
