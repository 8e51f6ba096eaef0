"""What a compiled lean-path module depends on: the ingredients its name is a hash of, and the check at
load of the one thing known only then, the cuDNN library the process loaded (docs/dispatch.md,
'Compiled lean path (built on first use)').

A module loaded under another interpreter ABI, torch build, header set or flags than it was compiled
for crashes or corrupts memory instead of failing cleanly, so each of those is in its name: a process
only ever looks for the module built for what it runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sys
import sysconfig
from pathlib import Path
from typing import Any, Optional

PREFIX = "fusedattn_select_native_"
CFLAGS = ("-O3", "-fvisibility=hidden", "-std=c++17")  # what native._build compiles lean.cpp with
CUDA_CFLAGS = ("-O3", "-std=c++17")
# The headers the module includes (cuDNN's last): the package whose directory holds them, the header
# looked for, what to install where it is missing, and the file and macros of their version.
HEADERS = (
    ("cudnn", "cudnn_frontend.h", "nvidia-cudnn-frontend", "cudnn_frontend_version.h",
     ("CUDNN_FRONTEND_MAJOR_VERSION", "CUDNN_FRONTEND_MINOR_VERSION", "CUDNN_FRONTEND_PATCH_VERSION")),
    ("nvidia.cudnn", "cudnn.h", "nvidia-cudnn-cu12 or -cu13", "cudnn_version.h",
     ("CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL")),
)
ABSENT = "absent"  # the value of headers not found (nothing is built without them)


class HeadersMissing(LookupError):
    """A header the module includes is not installed (the message names what to install)."""


def include_dirs() -> list[Path]:
    """cudnn-frontend's and cuDNN's header directories, in HEADERS' order (HeadersMissing naming
    what is missing)."""
    dirs = []
    for package, marker, install, _, _ in HEADERS:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
        # The frontend's wheel puts include/ beside its package; nvidia-cudnn puts it inside.
        found = [d for r in roots for d in (r.parent / "include", r / "include") if (d / marker).is_file()]
        if not found:
            raise HeadersMissing(f"no {marker} found beside the {package!r} package: install {install}")
        dirs.append(found[0])
    return dirs


def ingredients(source: Path) -> dict[str, Any]:
    """What the module compiled from `source` (and the headers beside it) depends on, by name (values
    JSON can write). The headers are the ones include_dirs() finds (ABSENT where none are installed)."""
    import torch

    parts = {
        # The extension suffix names the implementation, version, ABI flags (t: free-threaded, d: debug)
        # and platform; sys.implementation.cache_tag is the same for 3.13 and 3.13t.
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "abiflags": getattr(sys, "abiflags", ""),
        "gil_disabled": sysconfig.get_config_var("Py_GIL_DISABLED"),
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "torch_cuda": torch.version.cuda,
        # torch's C++ ABI: builds of one torch version differ in it (PyPI's and conda-forge's did).
        "cxx11_abi": getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None),
        "cflags": CFLAGS,
        "cuda_cflags": CUDA_CFLAGS,
    }
    for path in (source, *sorted(source.parent.glob("*.h"))):
        parts[f"source {path.name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    for (package, *_), version in zip(HEADERS, header_versions(_installed_dirs())):
        parts[f"headers {package}"] = version
    return parts


def name(parts: dict[str, Any]) -> str:
    """The module's name: a hash of its ingredients (the same in every process that has the same ones)."""
    text = json.dumps(parts, sort_keys=True)
    return PREFIX + hashlib.sha256(text.encode()).hexdigest()[:16]


def _installed_dirs() -> list[Path]:
    try:
        return include_dirs()
    except HeadersMissing:
        return []  # named as absent: no module is built without them


def header_versions(dirs: list[Path]) -> list[str]:
    """The version of each of HEADERS in `dirs` (include_dirs()' answer: "9.1.0"; ABSENT where not given; where a
    version file is missing, a hash of the header the module includes, so that no two differ unseen)."""
    versions = []
    for index, (_, marker, _, version_file, macros) in enumerate(HEADERS):
        if index >= len(dirs):
            versions.append(ABSENT)
            continue
        directory = dirs[index]
        try:
            text = (directory / version_file).read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        found = [re.search(rf"^\s*#\s*define\s+{macro}\s+(\d+)\b", text, re.MULTILINE) for macro in macros]
        if all(found):
            versions.append(".".join(str(int(match.group(1))) for match in found))
        else:
            versions.append("sha256:" + hashlib.sha256((directory / marker).read_bytes()).hexdigest())
    return versions


def cudnn_refusal(loaded: Optional[int]) -> str:
    """Why a module compiled against the cuDNN headers include_dirs() finds must not run with the cuDNN
    this process loaded (`loaded`: torch.backends.cudnn.version(), e.g. 90100), "" when it may. cuDNN
    runs code compiled against headers of its major version and of an equal or older minor (any patch),
    so a newer library is fine, and is not in the name (that would build one module per library)."""
    headers = header_versions(_installed_dirs())[-1]  # cuDNN's own, last of HEADERS
    if loaded is None or not re.fullmatch(r"\d+\.\d+\.\d+", headers):
        # No cuDNN loaded: the module's own start refuses (it looks for the libcudnn torch loaded).
        # Headers of no version: only a module planted by hand has them (build() needs the headers).
        return ""
    # cuDNN 9 numbers its versions major*10000 + minor*100 + patch; cuDNN 8 and older major*1000 + ...
    major, rest = divmod(loaded, 10000) if loaded >= 10000 else divmod(loaded, 1000)
    runtime = (major, rest // 100, rest % 100)
    compiled = tuple(int(part) for part in headers.split("."))
    if runtime[0] == compiled[0] and runtime[1] >= compiled[1]:
        return ""
    return (f"it was compiled against cuDNN {headers}'s headers and this process loaded cuDNN "
            f"{'.'.join(map(str, runtime))} ({'another major version' if runtime[0] != compiled[0] else 'older'})")
