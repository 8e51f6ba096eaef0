"""Section 7, shape buckets, parts C and D with Hugging Face transformers (random-init Llama, bf16):
generate() tokens/s and the logits of attn_implementation="fusedattn" vs "sdpa" (default and
pinned to flash), and a fine-tuning loop whose sequence length changes every step.

torch is passed in by the caller; transformers and the library are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import random
import time
import traceback
from typing import Any, Callable, Iterator, Mapping

from tools.bench.common import (
    RESULT_STATUS_OK,
    Partial,
    error_status,
    first_line,
    log,
    past,
    promotions_done,
    rotated,
    settle,
    skipped,
    summarize,
)

FUSEDATTN = "fusedattn"
SDPA = "sdpa"
SDPA_FLASH = "sdpa+flash"
SDPA_CUDNN = "sdpa+cudnn"
NO_ATTENTION = "no-attention"  # the floor of part D: a step without attention work
# implementation label -> (attn_implementation, SDPBackend the call is pinned to or None)
IMPLEMENTATIONS = {FUSEDATTN: (FUSEDATTN, None), SDPA: (SDPA, None), SDPA_FLASH: (SDPA, "FLASH_ATTENTION"),
                   SDPA_CUDNN: (SDPA, "CUDNN_ATTENTION"), NO_ATTENTION: (NO_ATTENTION, None)}
_SMALL = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
          "num_key_value_heads": 4, "vocab_size": 32000}
MODELS = {
    "llama-small": _SMALL,
    "llama-3-8b-dims-2-layers": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 2,
                                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                                 "vocab_size": 128256},
}


def model_text(name: str, layers: int | None = None) -> str:
    spec = MODELS[name]
    heads, kv = spec["num_attention_heads"], spec["num_key_value_heads"]
    return (f"{name}: hidden {spec['hidden_size']}, intermediate {spec['intermediate_size']}, "
            f"{layers or spec['num_hidden_layers']} layers, {heads}/{kv} heads, head dim "
            f"{spec.get('head_dim', spec['hidden_size'] // heads)}, vocab {spec['vocab_size']}")


def draw_lengths(seed: int, steps: int, low: int, high: int) -> list[int]:
    """The sequence length of each step (uniform in [low, high], the same for every implementation)."""
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(steps)]


def build_model(torch: Any, name: str, layers: int | None = None, seed: int = 0) -> Any:
    """A random-init LlamaForCausalLM of MODELS[name] on the GPU in bf16 (the same weights for a seed)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    spec = dict(MODELS[name])
    if layers:
        spec["num_hidden_layers"] = int(layers)
    cfg = LlamaConfig(max_position_embeddings=4096, **spec)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=SDPA)
    model.to(device="cuda", dtype=torch.bfloat16)
    # generate() with a static cache compiles the model's forward by default: these figures are eager.
    model.generation_config.disable_compile = True
    return model


def set_implementation(model: Any, label: str) -> None:
    name = IMPLEMENTATIONS[label][0]
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # older transformers read the name from the config at each call
        model.config._attn_implementation = name
    if model.config._attn_implementation != name:
        raise RuntimeError(f"attn_implementation is {model.config._attn_implementation!r} after setting {name!r}")


@contextlib.contextmanager
def pinned(label: str, expand_kv: bool = False) -> Iterator[None]:
    """torch SDPA pinned to the implementation's backend (nothing for the others); `expand_kv`: K/V
    repeated to the query heads by transformers instead of SDPA's enable_gqa."""
    backend = IMPLEMENTATIONS[label][1]
    with contextlib.ExitStack() as stack:
        if backend:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel(getattr(SDPBackend, backend)))
        if expand_kv:
            import transformers.integrations.sdpa_attention as hf_sdpa

            saved = hf_sdpa.use_gqa_in_sdpa
            hf_sdpa.use_gqa_in_sdpa = lambda *a, **k: False
            stack.callback(setattr, hf_sdpa, "use_gqa_in_sdpa", saved)
        yield


def _counters() -> dict:
    from fusedattn_select.runtime.api import dispatch_info

    info = dispatch_info()
    return {k: info.get(k, 0) for k in ("fused_calls", "fallback_calls", "plan_builds")}


def _delta(before: Mapping, after: Mapping) -> dict:
    return {k: after[k] - before[k] for k in after}


def _runs(label: str, first: Callable[[Callable], Any]) -> tuple[Callable, str]:
    """The context that runs `label` (pinned; K/V expanded if enable_gqa is rejected) after `first`
    ran once in it, and a note."""
    try:
        first(lambda: pinned(label))
        return (lambda: pinned(label)), ""
    except RuntimeError as err:
        if IMPLEMENTATIONS[label][1] is None:
            raise
        first(lambda: pinned(label, expand_kv=True))
        return (lambda: pinned(label, expand_kv=True)), f"K/V repeated (enable_gqa rejected: {first_line(err, 120)})"


# ----- part C: generate() ------------------------------------------------------------------------
def generate(torch: Any, args: Mapping, res: Partial) -> None:
    """Per model: tokens/s of each implementation and cache, and the logits of fusedattn vs sdpa."""
    import transformers

    from fusedattn_select.integrations.transformers import register

    register()
    res["transformers"] = transformers.__version__
    res["models"] = []
    for name in args["models"]:
        m: dict[str, Any] = {"model": model_text(name), "name": name, "runs": []}
        res["models"].append(m)
        if res.skipped_past(m, args.get("deadline"), 10):
            continue
        model = None
        try:
            model = build_model(torch, name)
            _generate_model(torch, model, m, args, res)
            m["status"] = RESULT_STATUS_OK
        except Exception as err:  # noqa: BLE001
            m["status"] = error_status(err)
            log(traceback.format_exc())
        del model
        settle(torch, name)
        res.save()


def _generate_model(torch: Any, model: Any, m: dict, args: Mapping, res: Partial) -> None:
    prompt, new = int(args["prompt"]), int(args["new_tokens"])
    gen = torch.Generator().manual_seed(int(args.get("seed", 0)))
    ids = torch.randint(3, model.config.vocab_size, (1, prompt + int(args["logit_extra"])), generator=gen).cuda()
    m["logits"] = _compare_logits(torch, model, ids)
    res.save()
    for cache in args["caches"]:
        timed = []
        for label in args["impls"]:
            run: dict[str, Any] = {"cache": cache, "impl": label}
            m["runs"].append(run)
            if res.skipped_past(run, args.get("deadline"), 6):
                continue
            try:
                timed.append(_GenerateRun(torch, model, ids[:, :prompt].contiguous(), run, new))
            except Exception as err:  # noqa: BLE001
                run["status"] = error_status(err)
                log(traceback.format_exc())
            res.save()
        # The implementations take turns (the order rotating), so a noisy host weighs on all alike.
        promotions_done()
        for g in timed:  # plans the worker stored are loaded here, not in a timed generate()
            try:
                g.warm()
            except Exception as err:  # noqa: BLE001
                g.run["status"] = error_status(err)
                log(traceback.format_exc())
        for rep in range(int(args["reps"])):
            for g in rotated(timed, rep):
                if past(args.get("deadline"), 6) or g.run.get("status"):
                    continue
                try:
                    g.sample()
                except Exception as err:  # noqa: BLE001
                    g.run["status"] = error_status(err)
                    log(traceback.format_exc())
        for g in timed:
            g.close()
        res.save()


def _compare_logits(torch: Any, model: Any, ids: Any) -> dict:
    """max |logits(fusedattn) - logits(sdpa)| and the share of positions with the same argmax."""
    out: dict[str, Any] = {"tokens": int(ids.shape[1])}
    try:
        logits = {}
        for label in (FUSEDATTN, SDPA):
            set_implementation(model, label)
            with torch.no_grad():
                logits[label] = model(input_ids=ids, use_cache=False).logits.float()
        a, b = logits[FUSEDATTN], logits[SDPA]
        out["max_abs_diff"] = float((a - b).abs().max())
        out["max_abs_logit"] = float(b.abs().max())
        out["argmax_agreement"] = float((a.argmax(-1) == b.argmax(-1)).float().mean())
        out["status"] = RESULT_STATUS_OK
    except Exception as err:  # noqa: BLE001
        out["status"] = error_status(err)
        log(traceback.format_exc())
    return out


def _promotion_warmups(model: Any) -> int:
    """Short generate()s after which the prompt's shape (called once per layer each) has reached
    attention()'s promotion to its own plans."""
    from fusedattn_select.runtime import entries
    from fusedattn_select.runtime.run_settings import run_settings

    layers = int(model.config.num_hidden_layers)
    # Past dense_after calls and two passes of its class (one per layer: entries.count_call).
    dense_after = run_settings.get().dense_after
    needed = max(dense_after, 2 * min(layers, entries.MAX_PASS) + 1)
    return 0 if dense_after == 0 else -(-needed // layers)


class _GenerateRun:
    """One implementation and cache on a model: warmed by short generate()s (enough for a shape every
    generate() repeats, the prompt's, to reach its own plans: DENSE_AFTER calls), then one
    full-length generate() reported apart (it meets every decode length once: for fusedattn new
    signatures and bucket plans), then `sample()` times one more each call (wall s)."""

    def __init__(self, torch: Any, model: Any, ids: Any, run: dict, new: int) -> None:
        self.torch, self.model, self.ids, self.run, self.new = torch, model, ids, run, new
        self.kwargs: dict[str, Any] = {"do_sample": False, "attention_mask": torch.ones_like(ids), "pad_token_id": 0}
        if run["cache"] == "static":
            self.kwargs["cache_implementation"] = "static"
        self.samples: list[tuple[int, float]] = []
        set_implementation(model, run["impl"])
        self.context, note = _runs(run["impl"], lambda c: self._once(c, 4))
        if note:
            run["note"] = note
        for _ in range(_promotion_warmups(model)):
            self.warm()
        before = _counters()
        tokens, seconds = self._once(self.context, new)
        run["first_tokens_per_s"] = tokens / seconds
        if run["impl"] == FUSEDATTN:
            run["first_attention_calls"] = _delta(before, _counters())
        self.before = _counters()

    def _once(self, context: Callable, tokens: int) -> tuple[int, float]:
        torch = self.torch
        set_implementation(self.model, self.run["impl"])  # the implementations share the model
        torch.cuda.synchronize()
        started = time.perf_counter()
        with context(), torch.no_grad():
            out = self.model.generate(self.ids, max_new_tokens=tokens, min_new_tokens=tokens, **self.kwargs)
        torch.cuda.synchronize()
        return int(out.shape[1] - self.ids.shape[1]), time.perf_counter() - started

    def warm(self) -> None:
        """One short generate(), untimed."""
        self._once(self.context, 4)

    def sample(self) -> None:
        self.samples.append(self._once(self.context, self.new))

    def close(self) -> None:
        run = self.run
        if run.get("status") or not self.samples:
            run.setdefault("status", skipped())
            return
        if run["impl"] == FUSEDATTN:
            run["attention_calls"] = _delta(self.before, _counters())
        run["new_tokens"] = self.samples[0][0]
        run["tokens_per_s"] = summarize([n / s for n, s in self.samples], "tokens/s")
        run["status"] = RESULT_STATUS_OK


# ----- part D: fine-tuning with a new sequence length every step ---------------------------------
def finetune(torch: Any, args: Mapping, res: Partial) -> None:
    """Every implementation steps through the same lengths, interleaved: step i of each runs before
    step i + 1 of any (the order rotating), so a noisy host weighs on all alike. Wall ms per step."""
    from fusedattn_select.integrations.transformers import register

    register()
    _register_no_attention()
    lengths = draw_lengths(int(args["seed"]), int(args["steps"]), *args["lengths"])
    again = draw_lengths(int(args["seed"]) + 1, len(lengths), min(lengths), max(lengths))
    res["model"] = model_text(args["model"], int(args["layers"]))
    res["batch"], res["step_lengths"], res["warm_length"] = int(args["batch"]), lengths, int(args["warm_length"])
    res["second_lengths"] = again
    res["runs"] = []
    loops = []
    for label in args["impls"]:
        run: dict[str, Any] = {"impl": label}
        res["runs"].append(run)
        if res.skipped_past(run, args.get("deadline"), 8):
            continue
        try:
            loops.append((run, _FinetuneLoop(torch, run, args)))
        except Exception as err:  # noqa: BLE001
            run["status"] = error_status(err)
            log(traceback.format_exc())
    # Process-wide caches keyed by shape (cuBLAS's GEMM heuristics, the caching allocator's blocks)
    # are paid by whichever implementation meets a length first; an untimed step of the floor (no
    # attention work at all) pays them before the timed steps, so rotation does not charge them to
    # the implementation that happens to go first.
    shared = next((loop for run, loop in loops if run["impl"] == NO_ATTENTION), None)
    res["shared_warm_step"] = shared is not None
    for key, seeds, pass_lengths in (("", 0, lengths), ("second_", 1000, again)):
        # A second pass at new lengths of the same range (a second epoch): the shape buckets it needs
        # exist by now, as after `warmup` over the ladder.
        for i, length in enumerate(pass_lengths):
            if shared is not None and not past(args.get("deadline"), 8):
                shared.warm_caches(length)
            for run, loop in rotated(loops, i):
                if run.get("status") and run["status"] != RESULT_STATUS_OK or past(args.get("deadline"), 8):
                    continue
                try:
                    loop.step(length, seeds + i, key)
                except Exception as err:  # noqa: BLE001
                    run["status"] = error_status(err)
                    log(traceback.format_exc())
        for run, loop in loops:
            loop.close(key, len(pass_lengths))
        res.save()
    for run, _ in loops:  # the first pass decides; an unfinished second pass has its own status
        run.setdefault("status", RESULT_STATUS_OK if "total_ms" in run else skipped())
    settle(torch, "finetune")


def _register_no_attention() -> None:
    """The floor: an attention function that does no attention (returns the queries), so its step
    time is what the rest of the model costs; no attention implementation can be faster."""
    from transformers import AttentionInterface

    def no_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> tuple:
        return query.transpose(1, 2), None

    AttentionInterface.register(NO_ATTENTION, no_attention)


def _batch(torch: Any, vocab: int, batch: int, length: int, seed: int) -> Any:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=gen).cuda()


class _FinetuneLoop:
    """One implementation's model, optimizer and pinned context (warmed by one step at the warm length)."""

    def __init__(self, torch: Any, run: dict, args: Mapping) -> None:
        self.torch, self.run = torch, run
        self.model = build_model(torch, args["model"], int(args["layers"]), seed=int(args["seed"]))
        set_implementation(self.model, run["impl"])
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.vocab, self.batch = self.model.config.vocab_size, int(args["batch"])
        self.context, note = _runs(run["impl"], lambda c: self._step(c, int(args["warm_length"]), 10_000))
        if note:
            run["note"] = note
        self.before = _counters()

    def _step(self, context: Callable, length: int, seed: int) -> tuple[float, float]:
        torch = self.torch
        ids = _batch(torch, self.vocab, self.batch, length, seed)
        self.opt.zero_grad(set_to_none=True)  # a failed try leaves no gradients behind
        torch.cuda.synchronize()
        started = time.perf_counter()
        with context():
            loss = self.model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
        self.opt.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - started) * 1e3, float(loss.detach())

    def warm_caches(self, length: int) -> None:
        """One untimed step at `length` (see finetune: the shared caches' first-shape costs)."""
        self._step(self.context, length, 20_000)

    def step(self, length: int, seed: int, key: str) -> None:
        ms, loss = self._step(self.context, length, seed)
        self.run.setdefault(key + "step_ms", []).append(ms)
        if not key:
            self.run.setdefault("losses", []).append(loss)

    def close(self, key: str, steps_wanted: int) -> None:
        """Totals of a finished pass (none for a pass cut short: its total would not compare);
        attention() counters over it."""
        steps = self.run.get(key + "step_ms") or []
        if len(steps) != steps_wanted:
            self.run[key + "pass_status"] = self.run.get("status") or skipped()
            return
        self.run[key + "total_ms"] = sum(steps)
        if not key:
            self.run["per_step_ms"] = summarize(steps, "ms")
        if self.run["impl"] == FUSEDATTN:
            after = _counters()
            self.run[("attention_calls" if not key else "second_attention_calls")] = _delta(self.before, after)
            self.before = after

