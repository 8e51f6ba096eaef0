"""Build ahead per model: the bucket plans a registered model's attention layers run, built in the
background before its calls need them, into the persistent store (the next process starts warm).

`register(model=...)` (or a config) reads the model's attention problems (problems.py) and walks
each problem class over its bucket ladder (buckets.py), up to `max_batch` and `max_length`
(default: each attention stack's own longest sequence as the model reader reads it,
`AttentionStack.positions`). The buckets go to the worker process that builds plans (runtime/dense_builds.queue_ahead) at the
priority of build-ahead work: any call's own preparation runs first.

Order (likeliest first): batch sizes smallest first, then lengths shortest first, and at each
(batch, length) the prefill before the decode step. Batch 1 and short prompts are what a
notebook's generate() meets first; a prompt of length L needs its prefill bucket and then decode
buckets from L up, so walking lengths upward serves the next prompts in the order they arrive, and
the shortest buckets build fastest, so the most calls are covered soonest.

The call configs are the ones the "fusedattn" attention function passes attention(): (B, H, S, D)
tensors (layout bhsd), a causal prefill ("causal"), a decode step over a DynamicCache
("causal_bottom_right", one query row: run with its KV heads as batch where buckets.heads_as_batch
takes it), the scale transformers' attention modules compute (head_dim ** -0.5 where the config
names none). Inference builds forward plans; `training=True` builds forward and backward plans of
the prefill ladder (no decode steps). Layers this integration does not run on cuDNN (soft-capping,
chunked attention at lengths of a chunk or more) and calls with no bucket form are left out,
counted and named in the log line that says how many buckets were queued.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_all
from dataclasses import replace
from typing import Any

from fusedattn_select import dtypes
from fusedattn_select.buckets import MIN_SEQLEN, bucket_batch, bucket_form, bucket_seqlen, heads_as_batch, powers_of_two
from fusedattn_select.config import AttnConfig
from fusedattn_select.errors import ConfigError
from fusedattn_select.integrations.transformers.config_json import config_data, source_name
from fusedattn_select.integrations.transformers.masks import cudnn_window
from fusedattn_select.integrations.transformers.model_reading import read_model
from fusedattn_select.integrations.transformers.problems import model_problems

PREFILL, DECODE = 0, 1


def _as_called(cfg: AttnConfig) -> AttnConfig:
    # transformers' attention modules pass scaling = head_dim ** -0.5, which differs from
    # 1 / sqrt(head_dim) in the last bit for some head dims (96, 128): another cache key.
    scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_dim_qk ** -0.5
    return cfg.replace(qkv_layout="bhsd_bhsd_bhsd", attn_scale=scale)


def model_calls(source: Any, *, max_batch: int = 1, max_length: int | None = None, training: bool = False,
                dtype: Any = None) -> list[AttnConfig]:
    """The call configs whose buckets build ahead for a model (a model, a config or a config.json
    source), one per bucket form, likeliest first (see the module docstring)."""
    return model_plan(source, max_batch=max_batch, max_length=max_length, training=training, dtype=dtype)[0]


def check_arguments(max_batch: Any, max_length: Any, training: Any) -> None:
    """ConfigError (a ValueError) naming the argument of register(model=...) / model_calls that is not right."""
    for field, value in (("max_batch", max_batch), ("max_length", max_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(field, value, "must be a positive integer"
                              + ("" if field == "max_batch" else ", or None for the model's own longest length"))
    if max_batch is None:
        raise ConfigError("max_batch", max_batch, "must be a positive integer")
    if training is not None and not isinstance(training, bool):
        raise ConfigError("training", training, "must be True, False or None (the model's own mode)")


def model_plan(source: Any, *, max_batch: int = 1, max_length: int | None = None, training: bool = False,
               dtype: Any = None) -> tuple[list[AttnConfig], str]:
    """(model_calls' configs, what was left out and why: "" when nothing was)."""
    check_arguments(max_batch, max_length, training)
    reading = read_model(config_data(source), source_name(source))
    found: list[tuple[tuple[int, int, int], AttnConfig]] = []
    left_out: dict[str, str] = {}
    # Each stack up to its own length (Whisper's decoder takes 448 tokens, its encoder 1500).
    ladders = [(replace(reading, stacks=(stack,)), max_length or stack.positions or stack.seqlen_kv)
               for stack in reading.stacks]
    for batch, (one, length) in itertools.product(powers_of_two(1, bucket_batch(max_batch)), ladders):
        for seqlen in powers_of_two(MIN_SEQLEN, bucket_seqlen(length)):
            for problem in model_problems(one, batch, seqlen, training, dtype, seqlen):
                if problem.integration_reasons:
                    left_out.setdefault(problem.name, problem.integration_reasons[0].split(":")[0])
                    continue
                prefill = _as_called(problem.config)
                found.append(((batch, seqlen, PREFILL), prefill))
                if not training and prefill.mask == "causal" and not problem.name.startswith("cross"):
                    decode = prefill.replace(seqlen_q=1, mask="causal_bottom_right",
                                             window_size=cudnn_window(problem.sliding_window, seqlen))
                    found.append(((batch, seqlen, DECODE), heads_as_batch(decode) or decode))
    calls, seen, formless = [], set(), 0
    for _, cfg in sorted(found, key=lambda item: item[0]):
        form = bucket_form(cfg)
        if form is None:
            formless += 1
        elif form.cache_key() not in seen:
            seen.add(form.cache_key())
            calls.append(cfg)
    notes = [f"{len(left_out)} layer problems ({', '.join(f'{n}: {why}' for n, why in left_out.items())})"] if left_out else []
    if formless:
        notes.append(f"{formless} calls with no bucket form (they build their own plans when called)")
    return calls, "; ".join(notes)


def _model_dtype(model: Any) -> str | None:
    """The dtype a loaded model's weights have, where it is one fused attention runs (else None)."""
    parameters = getattr(model, "parameters", None)
    if parameters is None:
        return None
    try:
        return dtypes.parse(next(parameters()).dtype)
    except (StopIteration, ValueError, TypeError):
        return None


def queue_model(model: Any, *, max_batch: int = 1, max_length: int | None = None,
                training: bool | None = None) -> Future | None:
    """Queue the model's buckets in the worker (see the module docstring); returns at once: the
    arguments are checked here (ConfigError naming one), the model is read and its buckets queued on
    a thread of their own. Its Future gives how many buckets were queued; None (logged) where no
    worker can build them."""
    from fusedattn_select.runtime import dense_builds

    check_arguments(max_batch, max_length, training)
    data = config_data(model)  # a source that cannot be read fails here, before anything is queued
    if training is None:  # a loaded model says whether it trains; a config is read for inference
        training = bool(getattr(model, "training", False)) and hasattr(model, "parameters")
    name = str(data.get("model_type") or type(model).__name__)
    dtype = _model_dtype(model)

    def calls() -> tuple[list[AttnConfig], str]:
        return model_plan(data, max_batch=max_batch, max_length=max_length, training=training, dtype=dtype)

    return dense_builds.queue_ahead(calls, f"{name} ({'training' if training else 'inference'}, "
                                           f"batch <= {max_batch})", _model_device(model))


def _model_device(model: Any) -> int:
    """The CUDA device a loaded model's weights are on (else this thread's current device, or 0)."""
    parameters = getattr(model, "parameters", None)
    with contextlib.suppress(StopIteration, TypeError, AttributeError):
        device = next(parameters()).device if parameters is not None else None
        if device is not None and device.type == "cuda" and device.index is not None:
            return int(device.index)
    import torch

    return int(torch.cuda.current_device()) if torch.cuda.is_initialized() else 0


def wait(timeout: float | None = None) -> bool:
    """Wait until every bucket this process queued is built (or skipped, or failed); whether all
    finished within `timeout` seconds (one deadline for the queueing and the builds). For scripts
    and tests that need the store warm."""
    from fusedattn_select.runtime.dispatcher import dispatcher

    deadline = None if timeout is None else time.monotonic() + timeout
    queueing = dispatcher.ahead_queuer.submit(lambda: None)  # after the queueing jobs submitted before it
    if wait_all([queueing], timeout=timeout)[1]:
        return False
    with dispatcher.ahead_lock:
        running = list(dispatcher.ahead)
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    return not wait_all(running, timeout=left)[1]
