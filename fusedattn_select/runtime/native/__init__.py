"""The compiled lean path: lean.cpp runs a lean entry's call (runtime/lean.py) in C++, with a C++
autograd node for training, so a call costs torch's own per-op overhead instead of Python's.

Building it (by hand or in the background), where modules live and what runs where none loads: see
docs/dispatch.md, 'Compiled lean path (built on first use)'.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from fusedattn_select import settings
from fusedattn_select.runtime.dispatcher import dispatcher
from fusedattn_select.runtime.native import autobuild, identity
from fusedattn_select.runtime.run_settings import run_settings
from fusedattn_select.store.locks import flock

log = logging.getLogger("fusedattn_select")

ENV_VAR = settings.NATIVE
DIR_ENV = settings.NATIVE_DIR
SOURCE = Path(__file__).with_name("lean.cpp")  # it includes the headers beside it
STAGING = "staging"  # the modules' subdirectory a build compiles and tests in (build())


class NativeBuildError(RuntimeError):
    """The compiled lean path could not be built: what was missing or what the compiler said."""


def enabled() -> bool:
    """Whether a built module may be used (FUSEDATTN_SELECT_NATIVE: "0" turns it off; "auto", the default, or "1")."""
    return run_settings.get().native != "0"  # ConfigError naming a variable when one is invalid


def generation() -> int:
    """How many modules this process's background build made loadable (lean entries made at an
    older count look for the module again)."""
    build = dispatcher.native_build  # read without the lock: calls ask on the hot path
    return 0 if build is None else build.generation


def background() -> autobuild.BackgroundBuild:
    """This process's background build of the module (made at first use)."""
    with dispatcher.native_lock:
        if dispatcher.native_build is None:
            dispatcher.native_build = autobuild.BackgroundBuild()
        return dispatcher.native_build


def include_dirs() -> list[Path]:
    """cudnn-frontend's and cuDNN's header directories (NativeBuildError naming what is missing)."""
    try:
        return identity.include_dirs()
    except identity.HeadersMissing as err:
        raise NativeBuildError(str(err)) from None


def module_name() -> str:
    """The build's name: a hash of what the module depends on (identity.ingredients: the sources, the
    interpreter's ABI, torch's build, the headers' versions, the flags), worked out once per process
    and source (every new call signature asks)."""
    name = dispatcher.native_names.get(SOURCE)
    if name is None:
        name = dispatcher.native_names[SOURCE] = identity.name(identity.ingredients(SOURCE))
    return name


def _cudnn_refusal() -> str:
    """Why the module must not run with the cuDNN torch loads ("" when it may): what it depends on
    that is known only at load (identity.cudnn_refusal)."""
    import torch

    try:
        loaded = torch.backends.cudnn.version()  # loads the cuDNN the module binds to
    except Exception as err:  # noqa: BLE001 - torch's own refusal of the cuDNN it found
        return f"torch could not load cuDNN ({type(err).__name__}: {err})"
    return identity.cudnn_refusal(loaded)


def build_dir() -> Path:
    """Where built modules live: $FUSEDATTN_SELECT_NATIVE_DIR, else native/ in the cache directory."""
    configured = os.environ.get(DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    from fusedattn_select.store.store_settings import default_cache_dir

    return default_cache_dir() / "native"


def _module_path(name: str) -> Path:
    return build_dir() / name / f"{name}.so"


def build(verbose: bool = False, background: bool = False) -> Path:
    """Compile lean.cpp for this torch and frontend (a minute or so) and test it; the module's path.

    Builds of one module queue on a file lock; one that finds it built tests it (a background one
    returns at once) and builds it again only where it fails (it was removed). The module
    is compiled and tested beside the others (in staging/) and renamed into place only once it
    passed, so no process loads an untested or half-written one. Raises NativeBuildError with the
    reason when it cannot be built here (a directory others can write included) or fails its test
    (then nothing is kept, the reason is remembered for background builds, and calls keep the
    Python path). `background`: started by a background build, which takes a failure it finds once
    it holds the lock (the failure of the build it queued behind) instead of compiling again."""
    name = module_name()
    autobuild.private_dirs(build_dir())
    refusal = autobuild.refusal(_module_path(name))
    if refusal:  # before compiling: torch loads what it compiled into this process
        raise NativeBuildError(f"{refusal}: compiled code runs as you, so it is built and loaded only from a "
                               f"directory owned by you and writable by no one else (chmod 700, or set {DIR_ENV})")
    with flock(autobuild.lock_path(_module_path(name)), math.inf):  # waits as long as another build runs
        if _module_path(name).is_file() and (background or _passes_its_test(_module_path(name))):
            return _module_path(name)
        failure = autobuild.earlier_failure(_module_path(name))
        if failure and background:
            # The build this one queued behind (another rank's) failed: compiling again would fail alike.
            raise NativeBuildError(f"the build this one waited for failed: {failure}")
        try:
            path = _build(name, verbose)
        except NativeBuildError as err:
            autobuild.remember_failure(_module_path(name), str(err))
            raise
    autobuild.failed_marker(path).unlink(missing_ok=True)
    return path


def _build(name: str, verbose: bool) -> Path:
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as err:
        raise NativeBuildError(f"torch is needed to build the compiled path ({err})") from None
    if cpp_extension.CUDA_HOME is None:
        raise NativeBuildError("no CUDA toolkit found (set CUDA_HOME)")
    includes = include_dirs()
    torch.backends.cudnn.version()  # the module finds the cuDNN torch loaded when it is imported
    staging = build_dir() / STAGING / name
    autobuild.private_dirs(staging)
    try:
        cpp_extension.load(name=name, sources=[str(SOURCE)], build_directory=str(staging),
                           extra_include_paths=[str(d) for d in includes],
                           extra_cflags=list(identity.CFLAGS), extra_cuda_cflags=list(identity.CUDA_CFLAGS),
                           with_cuda=True,
                           verbose=verbose, is_python_module=False)
    except Exception as err:  # noqa: BLE001 - the compiler's or ninja's own error, passed on whole
        raise NativeBuildError(f"compiling {SOURCE.name} failed: {err}") from None
    built = staging / f"{name}.so"
    try:
        os.chmod(built, 0o700)  # the linker gives it the umask's mode: group-writable (refused) under umask 002
    except OSError as err:
        raise NativeBuildError(f"the compiler left no module at {built} ({err.strerror or err})") from None
    _test_in_child(built)
    final = _module_path(name)
    autobuild.private_dirs(final.parent)
    os.replace(built, final)  # one rename: a process looking finds the tested module or none
    with dispatcher.native_lock:
        dispatcher.native_loaded.pop(name, None)
    log.info("fusedattn_select: compiled lean path built and tested: %s", final)
    return final


def _passes_its_test(path: Path) -> bool:
    """Whether the module at `path` passes its test; where it does not, it is removed, with one log line."""
    try:
        _test_in_child(path)
    except NativeBuildError as err:
        log.warning("fusedattn_select: the compiled lean path at %s is removed and built again: %s", path, err)
        return False
    return True


def _test_in_child(path: Path) -> None:
    """Run self_test() in a child process (a module that crashes must not take this one down) on the
    module at `path` (<directory>/<name>/<name>.so); remove it and raise NativeBuildError when it fails."""
    env = dict(os.environ, **{DIR_ENV: str(path.parent.parent), ENV_VAR: "1", settings.CACHE: "off"})
    code = "from fusedattn_select.runtime.native.check import self_test; self_test()"
    try:
        child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        failed = child.returncode != 0
        detail = f"exit code {child.returncode}: {(child.stderr or child.stdout)[-2000:]}"
    except subprocess.TimeoutExpired:
        failed, detail = True, "no answer within 600 s"
    if failed:
        path.unlink(missing_ok=True)
        raise NativeBuildError(f"the built module failed its test ({detail}); if it crashed, build with the "
                               f"compiler of the C++ runtime torch runs with (set CXX)")


def status() -> dict[str, Any]:
    """Whether the compiled path is on (and builds on first use), where its module for this torch and
    frontend belongs, whether it is built there or being built by this process (`problem`: why it
    cannot be, when that is known without building, or why an earlier build failed)."""
    info: dict[str, Any] = {"enabled": enabled(), "mode": run_settings.get().native, "dir": str(build_dir())}
    try:
        import torch  # noqa: F401 - module_name() needs it
    except ImportError:
        return dict(info, built=False, problem="torch is not installed")
    path = _module_path(module_name())
    info.update(module=str(path), built=path.is_file())
    try:
        info["include_dirs"] = [str(d) for d in include_dirs()]
    except NativeBuildError as err:
        info["problem"] = str(err)
    failure = "" if info["built"] else autobuild.earlier_failure(path)
    if failure:
        info["problem"] = f"an earlier build failed: {failure}"
    build = dispatcher.native_build
    info["building"] = build is not None and build.building
    refusal = untrusted(path) if info["built"] else ""
    info["refused"] = refusal or None
    mismatch = _cudnn_refusal() if info["built"] and not refusal else ""
    info["cudnn_mismatch"] = mismatch or None
    if refusal or mismatch:
        info["problem"] = f"built, but not loaded: {refusal or mismatch}"
    return info


def load(device: Optional[int] = None) -> Optional[ModuleType]:
    """The built module for this torch and frontend, or None (not built, off, or failed to load).
    `device`: the device the caller wants it for (a background build tests the module there; None:
    this thread's current device)."""
    if not enabled():
        return None
    name = module_name()
    loaded = dispatcher.native_loaded
    if name in loaded:
        return loaded[name]
    start_build = False
    with dispatcher.native_lock:
        if name not in loaded:
            module = _import(name)
            if module is not None:
                from fusedattn_select.runtime.args import TABLE_ARGUMENTS  # imports torch: loaded with it

                try:
                    module.set_argument_kinds(list(TABLE_ARGUMENTS.values()))
                except ValueError as err:  # the module and runtime/args.py disagree: the Python path
                    log.warning("fusedattn_select: the compiled module %s is not used: %s", name, err)
                    module = None
                else:
                    dispatcher.native_table, dispatcher.native_call = module, module.call
            else:
                start_build = run_settings.get().native == "auto" and not _module_path(name).is_file()
            # Filed last: the lock-free lookup above never sees a module whose kinds are not set.
            loaded[name] = module
    if start_build:
        background().start(_module_path(name), include_dirs, lambda: _forget_missing(name), device)
    return loaded[name]


def _forget_missing(name: str) -> None:
    """The module is built now: the next load() imports it."""
    with dispatcher.native_lock:
        if dispatcher.native_loaded.get(name, False) is None:
            del dispatcher.native_loaded[name]


def untrusted(path: Path) -> str:
    """Why the compiled module at `path` must not be loaded ("" when it may): the rule of serialized
    plans (trust.untrusted_reason), with the modules' directory as the directory the library owns."""
    return autobuild.refusal(path)


def _import(name: str) -> Optional[ModuleType]:
    path = _module_path(name)
    if not path.is_file():
        log.debug("fusedattn_select: compiled lean path not built for this torch and frontend (%s)", path)
        return None
    if name in sys.modules:
        return sys.modules[name]
    refusal = untrusted(path)
    if refusal:
        log.warning("fusedattn_select: not loading the compiled lean path %s: %s. Compiled code runs as you, "
                    "so its directory must be owned by you and writable by no one else (chmod 700); using "
                    "the Python path", path, refusal)
        return None
    mismatch = _cudnn_refusal()
    if mismatch:
        log.warning("fusedattn_select: not loading the compiled lean path %s: %s; using the Python path",
                    path, mismatch)
        return None
    try:
        # The path checked, with its links resolved: a link swapped after the check is not followed.
        spec = importlib.util.spec_from_file_location(name, os.path.realpath(path))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - any load failure means the pure-Python path
        log.warning("fusedattn_select: compiled lean path did not load (%s: %s); using the Python path",
                    type(err).__name__, err)
        return None
    sys.modules[name] = module
    log.info("fusedattn_select: compiled lean path loaded from %s", path)
    return module


def remember(q: Any, k: Any, v: Any, arguments: tuple, plan: Any) -> None:
    """File a call's LeanPlan in the table under the call's signature (what entries.fast_key holds); a call the
    table cannot hold is left to the Python path (docs/dispatch.md, 'Compiled lean path (built on first use)')."""
    table = dispatcher.native_table
    if table is not None:
        table.remember(q, k, v, arguments, plan)


def forget_calls() -> None:
    """Empty the table: the next call of each signature decides in Python. Its count of calls
    (dispatch_info's) goes on (clear_plans, which resets every counter, empties it through
    Dispatcher.clear)."""
    table = dispatcher.native_table
    if table is not None:
        dispatcher.native_forgotten_calls = table_calls()
        table.forget()


def table_calls() -> int:
    """Calls the table ran (0 where no module is loaded), since clear_plans."""
    table = dispatcher.native_table
    return 0 if table is None else dispatcher.native_forgotten_calls + int(table.calls())


def executes() -> int:
    """Graphs the compiled path has run in this process (0 where it is not loaded)."""
    return sum(int(module.executes()) for module in list(dispatcher.native_loaded.values()) if module is not None)


def graph(module: ModuleType, plan: Any, call_index: tuple[int, ...]) -> Optional[Any]:
    """The plan's graph deserialized in C++ with the call position of each of its tensors (made once
    per plan and binding), or None."""
    key = ("native", call_index)
    if key in plan.derived:
        return plan.derived[key]
    loaded = None
    uids = plan._uids
    if uids is not None:
        from fusedattn_select.probing.cudnn.plan_graphs import graph_bytes

        from fusedattn_select.runtime.streams import loading_stream

        index = plan.device.index or 0
        try:
            with loading_stream(index):  # the frontend's warm-up capture on a private stream (streams.py)
                loaded = module.load_graph(index, graph_bytes(plan.graph), list(uids), list(call_index))
        except Exception as err:  # noqa: BLE001 - the frontend's refusal: this plan runs the Python path
            log.info("fusedattn_select: compiled lean path cannot load a %s plan (%s); using the Python path",
                     plan.phase.value, err)
    plan.derived[key] = loaded
    return loaded


def plan_runner(plan: Any) -> Optional[Any]:
    """run(buffers) for a plan whose buffers come in its binding order (Plan.run's), through the
    compiled module; None where none is loaded or it cannot take the plan."""
    module = load(plan.device.index)
    if module is None:
        return None
    loaded = graph(module, plan, tuple(range(len(plan.order))))
    if loaded is None:
        return None
    run = module.run_tensors
    return lambda buffers: run(loaded, buffers)


def lean_plan(entry: Any, lean: Any) -> Optional[Any]:
    """The compiled LeanPlan of a lean entry, or None where the Python path must run it."""
    if entry.opts.training and lean.grads is None:
        return None
    module = load(entry.forward.device.index)
    if module is None:
        return None
    import torch

    forward = graph(module, entry.forward, lean.forward_index)
    if forward is None:
        return None
    shape, strides = lean.out
    plan = module.LeanPlan(forward, list(shape), list(strides), lean.out_dtype, lean.out_like_q,
                           list(lean.ragged_forward))
    if lean.stats is not None:
        if lean.stats.dtype != torch.float32:
            return None
        plan.set_stats(list(lean.stats.dims), list(lean.stats.strides))
    if lean.grads is not None:
        backward = graph(module, entry.backward, lean.backward_index)
        if backward is None:
            return None
        grads = [list(part) for geometry in lean.grads for part in geometry]
        plan.set_backward(backward, grads, list(lean.do_strides), lean.grads_like_qkv, list(lean.ragged_backward))
    return plan
