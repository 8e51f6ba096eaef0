"""Build ahead per model: the bucket plans a registered model's attention layers run, built in the
background before its calls need them, into the persistent store (the next process starts warm).

`register(model=...)` (or a config) reads the model's attention problems (problems.py) and walks
each problem class over its bucket ladder (buckets.py), up to `max_batch` and `max_length`
(default: the config's max_position_embeddings, or its n_positions / n_ctx / seq_length). The
buckets go to the worker process that builds plans (runtime/dense_builds.queue_ahead) at the
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
chunked attention) are left out.
"""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import wait as wait_all
from typing import Any

from fusedattn_select import dtypes
from fusedattn_select.buckets import MIN_SEQLEN, bucket_batch, bucket_form, bucket_seqlen, heads_as_batch
from fusedattn_select.config import AttnConfig
from fusedattn_select.integrations.transformers.config_json import config_data
from fusedattn_select.integrations.transformers.masks import cudnn_window
from fusedattn_select.integrations.transformers.problems import model_problems
from fusedattn_select.integrations.transformers.model_reading import read_model

# Keys a config.json gives its longest sequence by (families spell it differently); the nested
# text model's first, for multimodal configs.
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length", "max_target_positions")
PREFILL, DECODE = 0, 1


def _powers(low: int, high: int) -> list[int]:
    rungs = []
    while low <= high:
        rungs.append(low)
        low <<= 1
    return rungs


def max_positions(data: dict[str, Any]) -> int | None:
    """The longest sequence a config.json says its model takes, or None."""
    for source in (data.get("text_config"), data):
        if isinstance(source, dict):
            for key in _POSITION_KEYS:
                value = source.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    return None


def _as_called(cfg: AttnConfig) -> AttnConfig:
    # transformers' attention modules pass scaling = head_dim ** -0.5, which differs from
    # 1 / sqrt(head_dim) in the last bit for some head dims (96, 128): another cache key.
    scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_dim_qk ** -0.5
    return cfg.replace(qkv_layout="bhsd_bhsd_bhsd", attn_scale=scale)


def model_calls(source: Any, *, max_batch: int = 1, max_length: int | None = None, training: bool = False,
                dtype: Any = None) -> list[AttnConfig]:
    """The call configs whose buckets build ahead for a model (a model, a config or a config.json
    source), one per bucket form, likeliest first (see the module docstring)."""
    for field, value in (("max_batch", max_batch), ("max_length", max_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{field}={value!r}: must be a positive integer")
    data = config_data(source)
    reading = read_model(data)
    length = max_length or max_positions(data) or max(stack.seqlen_kv for stack in reading.stacks)
    found: list[tuple[tuple[int, int, int], AttnConfig]] = []
    for batch in _powers(1, bucket_batch(max_batch)):
        for seqlen in _powers(MIN_SEQLEN, bucket_seqlen(length)):
            for problem in model_problems(reading, batch, seqlen, training, dtype, seqlen):
                if problem.integration_reasons:
                    continue
                prefill = _as_called(problem.config)
                found.append(((batch, seqlen, PREFILL), prefill))
                if not training and prefill.mask == "causal" and not problem.name.startswith("cross"):
                    decode = prefill.replace(seqlen_q=1, mask="causal_bottom_right",
                                             window_size=cudnn_window(problem.sliding_window, seqlen))
                    found.append(((batch, seqlen, DECODE), heads_as_batch(decode) or decode))
    calls, seen = [], set()
    for _, cfg in sorted(found, key=lambda item: item[0]):
        form = bucket_form(cfg)
        if form is not None and form.cache_key() not in seen:
            seen.add(form.cache_key())
            calls.append(cfg)
    return calls


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
    """Queue the model's buckets in the worker (see the module docstring); returns at once. Its
    Future gives how many buckets were queued; None where plans are built inline."""
    from fusedattn_select.runtime import dense_builds

    if training is None:  # a loaded model says whether it trains; a config is read for inference
        training = bool(getattr(model, "training", False)) and hasattr(model, "parameters")
    calls = model_calls(model, max_batch=max_batch, max_length=max_length, training=training,
                        dtype=_model_dtype(model))
    name = str(config_data(model).get("model_type") or type(model).__name__)
    return dense_builds.queue_ahead(calls, f"{name} ({'training' if training else 'inference'}, "
                                           f"batch <= {max_batch})")


def wait(timeout: float | None = None) -> bool:
    """Wait until every bucket this process queued is built (or skipped, or failed); whether all
    finished within `timeout` seconds. For scripts and tests that need the store warm."""
    from fusedattn_select.runtime.dispatcher import dispatcher

    queueing = dispatcher.preparer.submit(lambda: None)  # after the queueing jobs submitted before it
    done, pending = wait_all([queueing], timeout=timeout)
    if pending:
        return False
    return not wait_all(list(dispatcher.ahead), timeout=timeout)[1]
