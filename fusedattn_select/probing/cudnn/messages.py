"""cuDNN's answers as this library's outcomes: one clean line, verdict or incident, a Verdict.

cuDNN and cudnn-frontend report a rejection as free text: a `[cudnn_frontend] Error:` prefix,
source-file/line prefixes, engine-config JSON dumps, multi-line plan-walk listings and (frontend
1.27+) a wrapper sentence around the backend's own reason. A verdict keeps that full text in
`Verdict.detail` and shows one line, the sentence a user can act on ("hidden_dim should be multiple
of 8"), in `Verdict.message`.

Building a graph ends in one of two exceptions: CudnnUnsupported (a verdict about the problem,
cacheable) or ProbeFailure (an incident: out of memory, CUDA or driver errors; never cached).
`classify_exception` sorts what cudnn-frontend raised into them; `verdict_from_exception` turns
either (or any other exception) into the Verdict that probing, warmup and dispatch record.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from fusedattn_select.errors import FusedAttnSelectError, ProbeError
from fusedattn_select.types import Backend, Outcome, Phase, ProbeDepth, Provenance, Verdict

STAGES = (
    "graph_api", "validate", "build_operation_graph", "create_execution_plans", "check_support",
    "build_plans",
)
MAX_MESSAGE_CHARS = 300

# Text that describes an incident (device, memory, driver or environment), not the problem. The
# frontend (1.27+) reports a failed backend lowering -- which can be a CUDA error or a missing
# module -- as a "decline" inside a cudnnGraphNotSupportedError, so the exception type alone cannot
# tell a verdict from an incident.
_ALWAYS_INCIDENT = (
    "out of memory",
    "alloc_failed",
    "allocation_failed",
    "cuda_error_",
    "cudaerror",
    "illegal memory access",
    "illegal address",
    "unspecified launch failure",
    "no cuda-capable device",
    "driver version is insufficient",
    "no module named",
    "cannot open shared object",
    "unable to find symbol",
)
# Incident words that also occur in cuDNN's per-engine listings next to "not supported" answers
# (one engine's status among many): an incident only when the text gives no support answer.
_INCIDENT_UNLESS_ANSWERED = (
    "cuda error",
    "cudnn_status_execution_failed",
    "cudnn_status_internal_error",
    "cudnn_status_not_initialized",
    "cudnn_status_runtime_",
    "cudnn_status_license_error",
    "cudnn_status_sublibrary_loading_failed",
    "initialization error",
    "failed to load",
    "unable to load",
)
_SUPPORT_ANSWERS = (
    "not_supported", "not supported", "no valid engine configs", "is only supported", "should be",
    "shoud be", "needs to be", "must be", "does not support",
)

_PREFIXES = (
    re.compile(r"\[cudnn_frontend\]\s*(error|warning)?\s*:?\s*", re.IGNORECASE),
    re.compile(r"\bcudnnGraphNotSupportedError\s*:\s*"),
    re.compile(r"\bcudnnGraphNotSupportedException\s*:\s*"),
    re.compile(r"\bRuntimeError\s*:\s*"),
)
# "/path/to/sdpa_node.h:123", "file.cpp(45)", " at line 12 of x.h", "in function foo()"
_FILE_LINE = re.compile(
    r"(?:\b(?:at|in)\s+)?(?:\S*/)?[\w.-]+\.(?:h|hpp|cpp|cu|cc|py)(?::\d+|\(\d+\))(?::\d+)?:?"
    r"|\bat line \d+(?: (?:of|in) \S+)?|\bin function [\w:~<>]+(?:\(\))?",
)
_WRAPPER_DECLINED = re.compile(r"the backend declined:\s*(.+?)(?:;\s*python engines (?:declined|that accepted)|\)?\s*$)", re.DOTALL)
_WRAPPER_PLAN_LIST = re.compile(r"no plan in the list could be built:\s*(.+)", re.DOTALL)
_PLAN_ENTRY = re.compile(r"^\s*\[\d+\]\s*[^:]*:\s*")
# cuDNN's engine listing: "Warning: CUDNN_STATUS_...; Reason: <sentence> at: <source expression>"
_SOURCE_EXPRESSION = re.compile(r"\s+at:\s+[^;\n]*")
_PLACEHOLDER_NAME = re.compile(r"\s+for\s+_{3,}")
_ENGINE_REASON = re.compile(r"^Warning:\s*(CUDNN_STATUS_\w+)\s*;\s*Reason:\s*(.+)$")
_SPACES = re.compile(r"\s+")


def is_incident(text: str) -> bool:
    """True when cuDNN's text describes a device/memory/driver/environment problem, not an answer
    about the problem (cuDNN's engine listings can mix both: the answer wins, out-of-memory and
    missing libraries excepted)."""
    lowered = text.lower()
    if any(marker in lowered for marker in _ALWAYS_INCIDENT):
        return True
    if any(answer in lowered for answer in _SUPPORT_ANSWERS):
        return False
    return any(marker in lowered for marker in _INCIDENT_UNLESS_ANSWERED)


def backend_decline(text: str) -> str | None:
    """The backend's own error inside frontend 1.27+'s "no engine ... proposed a plan" wrapper.

    That wrapper turns any failed backend lowering -- a CUDA error or a missing module included --
    into a cudnnGraphNotSupportedError, so the wrapped text is what tells a verdict from an incident.
    None when `text` is not such a wrapper.
    """
    match = _WRAPPER_DECLINED.search(text)
    return match.group(1) if match else None


def wrapped_failures(text: str) -> list[str]:
    """The errors a cudnnGraphNotSupportedError wraps: the backend's decline, and each entry of the
    plan walk's "no plan in the list could be built" list (a python engine reports an ImportError
    or a failed JIT build there as a decline). Empty when `text` wraps nothing."""
    declined = backend_decline(text)
    found = [] if declined is None else [declined]
    match = _WRAPPER_PLAN_LIST.search(text)
    if match:
        found += [line for line in match.group(1).splitlines() if line.strip()]
    return found


def _strip_json(text: str) -> str:
    """Remove balanced {...} and [...] blocks that look like JSON dumps (they contain quotes)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char in "{[":
            close = "}" if char == "{" else "]"
            depth, j = 0, i
            while j < len(text):
                if text[j] == char:
                    depth += 1
                elif text[j] == close:
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            block = text[i:j + 1]
            if j < len(text) and '"' in block:
                i = j + 1
                continue
        out.append(char)
        i += 1
    return "".join(out)


def _unwrap(text: str) -> str:
    """The backend's own reason inside the frontend's plan-walk wrapper sentences."""
    match = _WRAPPER_DECLINED.search(text)
    if match:
        return match.group(1)
    match = _WRAPPER_PLAN_LIST.search(text)
    if match:
        return match.group(1)
    return text


def _is_sentence(text: str) -> bool:
    return len(text.split()) >= 3 and not any(token in text for token in ("==", "->", "||", "&&"))


def clean_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """One line from cuDNN's text: prefixes, file/line markers and JSON dumps removed.

    Distinct sentences are kept in order and joined with "; "; the result is cut at `limit`.
    """
    text = _unwrap(str(text))
    text = _strip_json(text)
    text = _SOURCE_EXPRESSION.sub("", text)
    text = _PLACEHOLDER_NAME.sub("", text)
    parts: list[str] = []
    for raw in re.split(r"[\r\n]+|;\s*(?=Warning:)", text.replace("\\n", "\n")):
        line = _PLAN_ENTRY.sub("", raw)
        for prefix in _PREFIXES:
            line = prefix.sub("", line)
        line = _FILE_LINE.sub(" ", line)
        line = _SPACES.sub(" ", line).strip(" \t:;,-")
        reason = _ENGINE_REASON.match(line)
        if reason:
            if not _is_sentence(reason.group(2)):
                continue  # "finalize_internal()", "status", "(A == status) || ...": source, not reason
            line = f"{reason.group(2).rstrip('. ')} ({reason.group(1)})"
        if line and line.lower() not in (p.lower() for p in parts):
            parts.append(line)
    message = "; ".join(parts) or _SPACES.sub(" ", str(text)).strip()
    if len(message) > limit:
        message = message[: limit - 3].rstrip() + "..."
    return message


# ----- outcomes of a graph build -------------------------------------------------------------
# Exception types cudnn-frontend raises when it rejects a graph description or finds no engine for
# it (its "not supported" family). Everything else -- and any text that describes a device or
# environment incident -- is a ProbeFailure.
_VERDICT_EXCEPTIONS: tuple[type[BaseException], ...] = (RuntimeError, ValueError, NotImplementedError)


class _StageOutcome:
    """The fields of CudnnUnsupported and ProbeFailure (a mixin ahead of their exception base).

    `stage` is one of STAGES; `message` is one cleaned line; `detail` the full original text;
    `timings_ms` the stages that ran before the rejection or failure, in milliseconds. The
    exception text is "<_summary> at <stage>: <message>".
    """

    _summary = ""

    def __init__(self, stage: str, message: str, detail: str = "",
                 timings_ms: Mapping[str, float] | None = None) -> None:
        self.stage = stage
        self.message = message
        self.detail = detail or message
        self.timings_ms = dict(timings_ms or {})
        super().__init__(f"{self._summary} at {stage}: {message}")


class CudnnUnsupported(_StageOutcome, FusedAttnSelectError):
    """cuDNN (or the frontend's graph API) cannot run this problem: a cacheable verdict.

    Fields: see _StageOutcome (stage, message, detail, timings_ms).
    """

    _summary = "not supported"


class ProbeFailure(_StageOutcome, ProbeError):
    """Building the graph failed for a reason that says nothing about support (out of memory, a
    CUDA or driver error, a missing module, an unexpected exception). Never cached.

    Fields: see _StageOutcome (stage, message, detail, timings_ms).
    """

    _summary = "probe failed"


def classify_exception(stage: str, error: BaseException, timings: Mapping[str, float],
                       cudnn: Any) -> CudnnUnsupported | ProbeFailure:
    """cuDNN's 'not supported' family -> CudnnUnsupported; incidents and bugs -> ProbeFailure.

    A cudnnGraphNotSupportedError is a verdict (its engine listing may name other engines' status
    codes, e.g. an architecture mismatch) unless the errors it wraps (a failed backend lowering, the
    entries of the plan walk) describe an incident. A RuntimeError/ValueError/NotImplementedError
    from the frontend is its validation of the description, unless its text names an incident. Anything else (TypeError, MemoryError,
    ImportError, ...) is a failure. `cudnn` is the imported cudnn-frontend module.
    """
    text = str(error) or type(error).__name__
    detail = f"{type(error).__name__}: {text}"
    message = clean_message(text)
    not_supported = getattr(cudnn, "cudnnGraphNotSupportedError", None)
    if isinstance(not_supported, type) and isinstance(error, not_supported):
        wrapped = wrapped_failures(text)
        incident = bool(wrapped) and is_incident("\n".join(wrapped))
    elif isinstance(error, _VERDICT_EXCEPTIONS) and not isinstance(error, MemoryError):
        incident = is_incident(text)
    else:
        incident = True
    if incident:
        return ProbeFailure(stage, f"{type(error).__name__}: {message}", detail, timings)
    return CudnnUnsupported(stage, message, detail, timings)


def verdict_from_exception(err: BaseException, backend: Backend, phase: Phase, depth: ProbeDepth,
                           stage_default: str = "probe") -> Verdict:
    """The live-probe Verdict that an exception from building `phase` of a graph on `backend` means.

    CudnnUnsupported is UNSUPPORTED and ProbeFailure FAILED, each with its stage, message, detail
    and the timings of the stages that ran. Any other exception is FAILED at `stage_default`, with
    "<type>: <text>" as message and detail.
    """
    if isinstance(err, (CudnnUnsupported, ProbeFailure)):
        outcome = Outcome.UNSUPPORTED if isinstance(err, CudnnUnsupported) else Outcome.FAILED
        return Verdict(
            backend=backend, phase=phase, outcome=outcome, stage=err.stage, message=err.message,
            detail=err.detail, provenance=Provenance.LIVE_PROBE, depth=depth,
            timings_ms=tuple((name, float(ms)) for name, ms in err.timings_ms.items()),
        )
    text = f"{type(err).__name__}: {err}"
    return Verdict(
        backend=backend, phase=phase, outcome=Outcome.FAILED, stage=stage_default, message=text,
        detail=text, provenance=Provenance.LIVE_PROBE, depth=depth,
    )
