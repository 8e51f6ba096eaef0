"""The run's setup: device, driver, cuDNN, torch and library versions (the report's header)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Mapping

from tools.bench.common import ROOT, Partial, first_line
from tools.bench.runner import Runner


# ----- worker ------------------------------------------------------------------------------------
def worker(args: Mapping, res: Partial) -> None:
    res["python"] = platform.python_version()
    res["host"] = platform.node()
    try:
        import fusedattn_select

        res["library"] = fusedattn_select.__version__
    except Exception as err:  # noqa: BLE001
        res["library"] = f"import failed: {err}"
    import torch

    res["torch"] = torch.__version__
    res["torch_cuda"] = torch.version.cuda
    res["torch_cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        res["gpu_name"] = props.name
        res["capability"] = f"{props.major}.{props.minor}"
        res["sm_count"] = props.multi_processor_count
        res["memory_gib"] = round(props.total_memory / 2**30, 1)
        res["device_count"] = torch.cuda.device_count()
    res.update(_cudnn_versions())
    try:
        from fusedattn_select.probing.cudnn import CudnnEngine

        fp = CudnnEngine().fingerprint()
        res["driver"] = fp.driver_version
        res["fingerprint"] = fp.describe()
    except Exception as err:  # noqa: BLE001
        res["engine_error"] = f"{type(err).__name__}: {err}"
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit,pstate",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        res["nvidia_smi"] = smi.stdout.strip().splitlines()[0] if smi.stdout.strip() else smi.stderr.strip()
    except Exception as err:  # noqa: BLE001
        res["nvidia_smi"] = f"n/a: {err}"


def _cudnn_versions() -> dict:
    out = {}
    try:
        import cudnn

        out["cudnn_frontend"] = str(getattr(cudnn, "__version__", "unknown"))
        from fusedattn_select.types import format_cudnn_version

        out["cudnn_backend"] = format_cudnn_version(int(cudnn.backend_version()))
    except Exception as err:  # noqa: BLE001
        out["cudnn_error"] = f"{type(err).__name__}: {err}"
    return out


# ----- parent ------------------------------------------------------------------------------------
def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def meta(runner: Runner) -> dict:
    """The document's meta block, from an "env" worker."""
    res = runner.worker("env", {}, "env")
    out = {
        "device": _device_text(res),
        "gpu": first_line(res.get("nvidia_smi") or "") or res.get("gpu_name") or "n/a",
        "driver": res.get("driver") or "n/a",
        "cudnn_backend": res.get("cudnn_backend", "n/a"),
        "cudnn_frontend": res.get("cudnn_frontend", "n/a"),
        "torch": _torch_text(res),
        "library": f"{res.get('library', 'n/a')} (git {_git_rev()})",
        "python": res.get("python", platform.python_version()),
        "host": res.get("host", platform.node()),
        "date_utc": utc_now(),
        "mode": runner.plan["mode"],
        "budget_s": runner.args.budget,
        "nvidia_smi": res.get("nvidia_smi"),
        "fingerprint": res.get("fingerprint"),
        "env_status": res.get("status"),
    }
    for key in ("engine_error", "cudnn_error"):
        if res.get(key):
            out[key] = res[key]
    return out


def _device_text(res: Mapping) -> str:
    name = res.get("gpu_name")
    if not name:
        return "n/a (no CUDA device: " + str(res.get("status", "")) + ")"
    extra = ", ".join(x for x in (
        f"sm_{res.get('capability', '?').replace('.', '')}",
        f"{res.get('sm_count', '?')} SMs",
        f"{res.get('memory_gib', '?')} GiB",
        f"{res.get('device_count', 1)} visible",
    ))
    return f"{name} ({extra})"


def _torch_text(res: Mapping) -> str:
    if not res.get("torch"):
        return "n/a"
    return f"{res['torch']} (CUDA {res.get('torch_cuda')}, torch's cuDNN {res.get('torch_cudnn')})"


def _git_rev() -> str:
    """$FUSEDATTN_BENCH_REV where set (a copy of the tree, e.g. `git archive`), else the commit of the
    git checkout whose top level is this tree (not of a checkout it merely sits inside), with
    "+modified" where tracked files differ from it: a tree copied over an older checkout's .git (as
    the lent GPU machine's can be) is then not recorded as that older commit."""
    named = os.environ.get("FUSEDATTN_BENCH_REV")
    if named:
        return named
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=str(ROOT), timeout=10)
        lines = out.stdout.split()
        if out.returncode == 0 and len(lines) == 2 and Path(lines[0]).resolve() == Path(ROOT).resolve():
            changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                     text=True, cwd=str(ROOT), timeout=30)
            return lines[1] + ("+modified" if changed.returncode != 0 or changed.stdout.strip() else "")
    except Exception:  # noqa: BLE001
        pass
    return "n/a"


def standalone_record(torch: Any) -> dict:
    """The device and versions a standalone tool (tools/bench_*.py) writes beside its figures."""
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, **_cudnn_versions(),
            "fusedattn_select": _git_rev()}


def standalone_args(doc: str, argv: list[str] | None) -> argparse.Namespace:
    """The arguments of a standalone tool whose only option is -o/--output (its JSON file)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("-o", "--output", default=None, help="write the figures as JSON here")
    return parser.parse_args(argv)


def triton_missing(tool: str) -> bool:
    """True, after saying why, where the FP8 Triton kernels a standalone tool times cannot run."""
    from fusedattn_select.runtime import fp8_kernels

    why = fp8_kernels._load_triton()
    if why is not None:
        print(f"{tool}: Triton cannot run here: {why}")
    return why is not None


def emit(record: Mapping, path: str | None) -> None:
    """Print a standalone tool's record as JSON, and write it to `path` where one is given."""
    print(json.dumps(record, indent=1))
    if path:
        with open(path, "w") as out:
            json.dump(record, out, indent=1)
