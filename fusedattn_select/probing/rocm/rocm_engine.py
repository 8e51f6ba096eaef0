"""ROCm probing engines: answers from declared tables, and the seam for a live hipDNN probe.

hipDNN's Python frontend is not installable yet, so ROCm verdicts come from declared tables (see
tables.py); every one says "declared, not probed" and cites its sources.
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from fusedattn_select._version import __version__
from fusedattn_select.probing.rocm._core import (
    DECLARED,
    AttnConfig,
    Backend,
    Fingerprint,
    Outcome,
    Phase,
    ProbeDepth,
    ProbeEngine,
    Provenance,
    Verdict,
    declared_provenance,
)
from fusedattn_select.probing.rocm.checks import CHECKS, TableAnswer, listed_architectures
from fusedattn_select.probing.rocm.rocm_device import split_arch
from fusedattn_select.probing.rocm.tables import DECLARED_DIR, TABLE_NAMES, DeclaredTable, load_table

log = logging.getLogger("fusedattn_select")

NOT_PROBED = "declared, not probed"
HIPDNN_FRONTEND = "hipdnn_frontend"
# The depth a declared table answers at: nothing is built or run, as a probe stopping at check_support.
DECLARED_DEPTH = ProbeDepth.FAST
_DEEPER_ASKS = {ProbeDepth.FULL: "whether the kernels build",
                ProbeDepth.VERIFY: "whether they compute the right results"}


def _backend_reasons(cfg: AttnConfig, backend: Backend) -> list[str]:
    if backend is Backend.NONE:
        return ["backend NONE has no kernels"]
    if backend is not cfg.candidate:
        return [f"qkv_dtype={cfg.qkv_dtype!r} asks for backend {cfg.candidate.value}, not {backend.value}"]
    return []


class DeclaredRocmEngine:
    """Verdicts for one gfx architecture from declared tables, consulted in order.

    A phase is SUPPORTED when a table declares it (stage "declared:<table>"); NO_DATA when none does
    and one has no data for it (a field or dtype it does not cover, and no reason against it);
    otherwise UNSUPPORTED with every reason of every table (stage "declared:<t1>+<t2>..."). Verdicts
    carry provenance `declared`, depth fast (nothing is built or run: a "yes" asked at depth full or
    verify is NO_DATA), and their detail cites each table's sources (repository, path, commit).
    """

    def __init__(self, arch: str, tables: Sequence[str] = TABLE_NAMES, directory: str = str(DECLARED_DIR)) -> None:
        self.arch, _ = split_arch(arch)
        self.tables: tuple[DeclaredTable, ...] = tuple(load_table(name, directory) for name in tables)
        self.name = f"{DECLARED}:rocm:{self.arch}"
        self.provenance: Provenance = declared_provenance()

    def fingerprint(self) -> Fingerprint:
        """Platform "rocm", the arch as device name; the table digests make the library version."""
        digests = ".".join(f"{t.name}-{t.digest}" for t in self.tables)
        return Fingerprint(platform="rocm", device_name=self.arch, library_version=f"{__version__}+{DECLARED}.{digests}")

    def listed(self) -> dict[str, list[str]]:
        """The architectures of each table that lists any (checks.listed_architectures), for telling an
        architecture no table knows."""
        found = {table.name: listed_architectures(table) for table in self.tables}
        return {name: archs for name, archs in found.items() if archs}

    def answers(self, cfg: AttnConfig, phase: Phase) -> tuple[TableAnswer, ...]:
        """Each table's answer for one phase of `cfg` on this arch."""
        return tuple(CHECKS[t.name](t, cfg, phase, self.arch) for t in self.tables)

    def probe(self, cfg: AttnConfig, backend: Backend, phase: Phase, depth: ProbeDepth) -> Verdict:
        start = time.perf_counter()
        backend_reasons = _backend_reasons(cfg, backend)
        answers = self.answers(cfg, phase)
        chosen = next((a for a in answers if a.supported), None) if not backend_reasons else None
        timings = ((DECLARED, (time.perf_counter() - start) * 1000.0),)
        detail = self._detail(answers)
        if chosen is not None:
            notes = "; ".join(n for n in chosen.notes if n)
            message = f"{NOT_PROBED}: {chosen.table} declares it" + (f" ({notes})" if notes else "")
            if not DECLARED_DEPTH.answers(depth):
                return self._no_data(backend, phase, _deeper_message(chosen.table, depth), detail, timings,
                                     f"{DECLARED}:{chosen.table}")
            return Verdict(backend, phase, Outcome.SUPPORTED, f"{DECLARED}:{chosen.table}", message,
                           detail, self.provenance, DECLARED_DEPTH, timings)
        reasons = backend_reasons + [f"{a.table}: {r}" for a in answers for r in a.reasons]
        gaps = [f"{a.table}: {g}" for a in answers if a.no_data for g in a.gaps] if not backend_reasons else []
        if gaps:
            silent = [a.table for a in answers if a.no_data]
            message = (f"{NOT_PROBED}: no table declares it and {', '.join(silent)} "
                       f"{'has' if len(silent) == 1 else 'have'} no data: " + "; ".join(gaps + reasons))
            return self._no_data(backend, phase, message, detail, timings)
        stage = f"{DECLARED}:" + "+".join(t.name for t in self.tables)
        message = f"{NOT_PROBED}: " + "; ".join(reasons)
        log.debug("declared %s %s %s on %s: %s", backend.value, phase.value, Outcome.UNSUPPORTED.value, self.arch,
                  message)
        return Verdict(backend, phase, Outcome.UNSUPPORTED, stage, message, detail, self.provenance, DECLARED_DEPTH,
                       timings)

    def _no_data(self, backend: Backend, phase: Phase, message: str, detail: str,
                 timings: tuple[tuple[str, float], ...], stage: str = "") -> Verdict:
        """NO_DATA at depth fast; the stage names the table that declares the problem when one does, else all."""
        stage = stage or f"{DECLARED}:" + "+".join(t.name for t in self.tables)
        log.debug("declared %s %s %s on %s: %s", backend.value, phase.value, Outcome.NO_DATA.value, self.arch, message)
        return Verdict(backend, phase, Outcome.NO_DATA, stage, message, detail, self.provenance, DECLARED_DEPTH,
                       timings)

    def _detail(self, answers: Sequence[TableAnswer]) -> str:
        lines = [f"{NOT_PROBED}; arch {self.arch}"]
        for table, answer in zip(self.tables, answers):
            verdict = ("declared supported" if answer.supported else f"no data, {len(answer.gaps)} gap(s)"
                       if answer.no_data else f"{len(answer.reasons)} reason(s)")
            lines.append(f"{table.describe_sources()} -> {verdict}")
            lines += [f"  - {reason}" for reason in answer.reasons]
            lines += [f"  - no data: {gap}" for gap in answer.gaps]
        return "\n".join(lines)


def _deeper_message(table: str, depth: ProbeDepth) -> str:
    """Why a declared "yes" does not answer a question at depth full or verify."""
    return (f"{NOT_PROBED}: {table} declares it, at depth {DECLARED_DEPTH.value} only (nothing is built or run); "
            f"depth {depth.value} asks {_DEEPER_ASKS[depth]}, which only a live hipDNN probe could answer, "
            "and none is implemented")


# ----- the seam for a live hipDNN probe --------------------------------------------------------
@runtime_checkable
class HipdnnGraphSteps(Protocol):
    """The build steps a live hipDNN SDPA probe would run, named as in cudnn-frontend.

    Each step raises when hipDNN rejects the graph; the step that raised becomes the verdict's stage.
    """

    def validate(self) -> None: ...

    def build_operation_graph(self) -> None: ...

    def create_execution_plans(self, heuristics: Sequence[Any]) -> None: ...

    def check_support(self) -> None: ...

    def build_plans(self) -> None: ...


LiveEngineFactory = Callable[[Any, str], ProbeEngine]


def select_rocm_engine(arch: str, live_factory: LiveEngineFactory | None = None) -> tuple[ProbeEngine, str]:
    """The engine for `arch`: live hipDNN when its frontend imports and a factory is given, else declared.

    Returns (engine, reason); the reason says why the answers are declared, "" for a live engine.
    `live_factory(hipdnn_frontend_module, arch)` builds the live engine; none exists yet, and no caller
    passes one (the CLI calls select_rocm_engine(arch)), so every ROCm answer today is declared.
    """
    try:
        frontend = importlib.import_module(HIPDNN_FRONTEND)
    except ImportError as err:
        reason = f"{HIPDNN_FRONTEND} is not installed ({err}); ROCm answers are {NOT_PROBED}"
        return DeclaredRocmEngine(arch), reason
    if live_factory is None:
        reason = f"{HIPDNN_FRONTEND} imports but no live hipDNN probe is implemented; ROCm answers are {NOT_PROBED}"
        return DeclaredRocmEngine(arch), reason
    return live_factory(frontend, split_arch(arch)[0]), ""
