"""Worker side of the parts that run transformers models (random weights from a config, bf16, no
downloads): generate() in a fresh process (row 2), fine-tuning with a new sequence length every step
(row 3), and the long-lived worker of the compiled-code turns (row 7).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from tools.first_contact.options import repeat_name
from tools.first_contact.processes import emit
from tools.first_contact.sides import device, dispatch_record, hf_context, hf_implementation, sync, timed_ms

# dispatch_info() keys whose standing still means no plan is being built or swapped in any more.
SETTLED_KEYS = ("plan_builds", "plan_loads", "signatures", "swaps", "promotions")


def build_model(torch: Any, config: Mapping[str, Any], side: str, seed: int) -> Any:
    """A causal LM of `config` (its "model_type" and fields) with the seed's random weights, in bf16
    on the device, using `side`'s attention; generate() runs eager (no compiled forward)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(config)
    hf_config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    implementation = hf_implementation(side)
    torch.manual_seed(seed)
    with torch.device(device()):
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=implementation)
    model.to(dtype=torch.bfloat16)
    model.generation_config.disable_compile = True
    return model


def token_ids(torch: Any, vocab: int, batch: int, length: int, seed: int) -> Any:
    """Seeded random token ids (the same on every side), on the device."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=generator).to(device())


def host_probe(iterations: int = 40_000) -> tuple[float, float]:
    """(wall ms, this thread's CPU ms) of a fixed pure-Python loop: how fast the host runs this process's
    Python right now (the CPU time leaves out waits for the GIL or the CPU; why row 2 asks:
    docs/performance.md, 'First contact')."""
    wall, cpu = time.perf_counter(), time.thread_time()
    total = 0
    for i in range(iterations):
        total += i & 7
    return (time.perf_counter() - wall) * 1e3, (time.thread_time() - cpu) * 1e3


def _generate(torch: Any, model: Any, ids: Any, new_tokens: int, side: str) -> tuple[Any, float]:
    """generate()'s output and its ms (greedy, exactly `new_tokens` new tokens, no padding)."""
    out = []

    def run() -> None:
        with hf_context(side), torch.no_grad():
            out.append(model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=False, pad_token_id=0))

    ms = timed_ms(torch, run)
    return out[0], ms


def generate(side: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """Row 2: a fresh process's first generate(), the same call again (`again_calls` times: "again",
    "again 2", ...), then a new prompt length's first call; tokens/s counts the new tokens of every row
    of the batch."""
    import torch
    import transformers

    config, batch, new_tokens, seed = args["config"], int(args["batch"]), int(args["new_tokens"]), int(args["seed"])
    model = build_model(torch, config, side, seed).eval()
    again = int(args.get("again_calls", 1))
    prompts = {"first": int(args["prompt"]),
               **{repeat_name("again", n): int(args["prompt"]) for n in range(1, again + 1)},
               "new_prompt": int(args["new_prompt"])}
    result: dict[str, Any] = {"transformers": transformers.__version__, "calls": {}}
    for label, length in prompts.items():
        ids = token_ids(torch, int(config["vocab_size"]), batch, length, seed + length)
        before = host_probe()
        out, ms = _generate(torch, model, ids, new_tokens, side)
        made = int(out.shape[1] - length)
        probes = (before, host_probe())
        result["calls"][label] = {"prompt": length, "new_tokens": made, "ms": ms,
                                  "tokens_per_s": batch * made / (ms / 1e3), "probe_ms": [p[0] for p in probes],
                                  "probe_cpu_ms": [p[1] for p in probes]}
        if label == "first":
            result["first_tokens"] = out[0, length:].tolist()  # row 0's greedy tokens, to compare the sides
    return result


def train_step(torch: Any, model: Any, optimizer: Any, ids: Any, side: str) -> tuple[float, float]:
    """One synchronised training step (forward, backward, AdamW): its ms and loss."""
    losses = []

    def run() -> None:
        optimizer.zero_grad(set_to_none=True)
        with hf_context(side):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
        optimizer.step()
        losses.append(loss.detach())

    ms = timed_ms(torch, run)
    return ms, float(losses[0])


def finetune(side: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """Row 3: training steps whose sequence length changes every step (the seeded lengths), each timed
    from the process's first step on."""
    import torch

    from tools.bench.shapes_hf import draw_lengths

    config, batch, seed = args["config"], int(args["batch"]), int(args["seed"])
    model = build_model(torch, config, side, seed).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = draw_lengths(seed, int(args["steps"]), *args["lengths"])
    result: dict[str, Any] = {"lengths": lengths, "batch": batch, "step_ms": [], "losses": []}
    for index, length in enumerate(lengths):
        ids = token_ids(torch, int(config["vocab_size"]), batch, length, seed + index)
        ms, loss = train_step(torch, model, optimizer, ids, side)
        result["step_ms"].append(ms)
        result["losses"].append(loss)
    return result


def settle(work: list[Callable[[], Any]], most: int = 8) -> int:
    """Run every `work` in rounds until a round builds, loads or swaps in no plan (the worker
    process's pending builds waited for after each round); the rounds it took (at most `most`)."""
    from fusedattn_select import dispatch_info
    from tools.bench.common import promotions_done

    seen = None
    for rounds in range(1, most + 1):
        for item in work:
            item()
        try:
            promotions_done(60.0)
        except Exception:  # noqa: BLE001, S110 - the runtime's internals moved: settled by the counters alone
            pass
        info = dispatch_info()
        now = tuple(info.get(key) for key in SETTLED_KEYS)
        if now == seen:
            return rounds
        seen = now
    return most


def native_serve(side: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """Row 7's worker (FUSEDATTN_SELECT_NATIVE set by the parent): model 2a's generate(), row 3's
    model at a fixed length and an FP8 inference stack, settled; then one turn per "turn" line on
    stdin (two generate()s, three training steps, three FP8 forwards), until "stop"."""
    import torch

    seed = int(args["seed"])
    gen_config, batch, prompt, new_tokens = args["generate"]
    gen_model = build_model(torch, gen_config, side, seed).eval()
    prompt_ids = token_ids(torch, int(gen_config["vocab_size"]), batch, prompt, seed + prompt)
    train_model = build_model(torch, args["train_config"], side, seed).train()
    optimizer = torch.optim.AdamW(train_model.parameters(), lr=1e-4)
    train_ids = token_ids(torch, int(args["train_config"]["vocab_size"]), int(args["train_batch"]),
                          int(args["train_length"]), seed)

    def tokens_per_s() -> float:
        out, ms = _generate(torch, gen_model, prompt_ids, new_tokens, side)
        return batch * int(out.shape[1] - prompt) / (ms / 1e3)

    def step_ms() -> float:
        return train_step(torch, train_model, optimizer, train_ids, side)[0]

    fp8_stack = fp8_layers(torch, args["fp8"], seed)
    rounds = settle([tokens_per_s, step_ms, fp8_stack])
    sync(torch)
    emit({"ready": True, "settle_rounds": rounds, **dispatch_record()})
    for line in sys.stdin:
        if line.strip() != "turn":
            break
        emit({"generate_tokens_per_s": [tokens_per_s() for _ in range(2)],
              "train_step_ms": [step_ms() for _ in range(3)],
              "fp8_forward_ms": [timed_ms(torch, fp8_stack) for _ in range(3)]})
    return {"stopped": True}


def fp8_layers(torch: Any, spec: Mapping[str, Any], seed: int) -> Callable[[], Any]:
    """An inference forward of `spec["layers"]` decoder layers (bf16 projections and MLP, attention
    through attention(fp8=True), causal, current scaling) on one bshd batch: the FP8 workload of the
    compiled FP8 forward."""
    import fusedattn_select

    batch, length, hidden, heads, kv_heads, ffn = (int(spec[k]) for k in
                                                    ("batch", "length", "hidden", "heads", "kv_heads", "ffn"))
    head_dim = hidden // heads
    torch.manual_seed(seed)
    make = {"device": device(), "dtype": torch.bfloat16}
    layers = [{"qkv": torch.randn(hidden, (heads + 2 * kv_heads) * head_dim, **make) / hidden ** 0.5,
               "o": torch.randn(heads * head_dim, hidden, **make) / hidden ** 0.5,
               "up": torch.randn(hidden, ffn, **make) / hidden ** 0.5,
               "down": torch.randn(ffn, hidden, **make) / ffn ** 0.5} for _ in range(int(spec["layers"]))]
    x0 = torch.randn(batch, length, hidden, **make)

    @torch.inference_mode()
    def forward() -> Any:
        x = x0
        for w in layers:
            q, k, v = (x @ w["qkv"]).split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
            o = fusedattn_select.attention(q.reshape(batch, length, heads, head_dim),
                                           k.reshape(batch, length, kv_heads, head_dim),
                                           v.reshape(batch, length, kv_heads, head_dim), mask="causal", fp8=True)
            x = x + o.reshape(batch, length, -1) @ w["o"]
            x = x + torch.nn.functional.silu(x @ w["up"]) @ w["down"]
        return x
    return forward
