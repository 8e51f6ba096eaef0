"""The command line, the workload of each part (data), and the run's time budget."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Part name -> the done-when rows of issue 34 it measures. Rows 1 and 4 share their processes.
PARTS = {"first_calls": (1, 4), "generate": (2,), "finetune": (3,), "big_shape": (5,), "first_step": (6,),
         "native": (7,)}
ROWS = tuple(sorted(row for rows in PARTS.values() for row in rows))
FULL_BUDGET_S = 460.0  # under 8 minutes on an H100 with the compiled module still to build
QUICK_BUDGET_S = 300.0

# ----- workloads (the same for every side) --------------------------------------------------------
HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
FIRST_CALL_SHAPES = ((2, 1000), (2, 3000))  # (batch, seqlen): the second lies in another bucket
TINY = (1, 64, 1, 64)  # b, s, h, d
TINY_CALLS = 1100
BIG_SHAPE = (1, 8192, HEADS_Q, HEADS_KV, HEAD_DIM)  # Llama-3-8B's attention: b, s, hq, hkv, d
FIRST_STEP_SHAPE = (2, 4096, HEADS_Q, HEADS_KV, HEAD_DIM)

LLAMA = {"model_type": "llama", "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 6,
         "num_attention_heads": 12, "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 4096}
QWEN2 = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 4,
         "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 4096,
         "tie_word_embeddings": True}
# name -> (config, batch, prompt length, new tokens, the new prompt length of the third call)
GENERATE = {"llama": (LLAMA, 1, 300, 32, 717), "qwen2": (QWEN2, 2, 300, 32, 717)}
FINETUNE = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
            "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
            "max_position_embeddings": 4096}
FINETUNE_BATCH, FINETUNE_LENGTHS = 4, (300, 1100)
NATIVE_TRAIN_LENGTH = 1024
# Row 7's FP8 inference stack: Llama-3-8B's layer dimensions at b2 s4096, where the FP8 call through
# Python was host-bound.
NATIVE_FP8 = {"layers": 4, "batch": 2, "length": 4096, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336}
SEED = 0
# Row 2 times the same generate() this many times after the first (the calls "again", "again 2", ...):
# a host that switches speed every few seconds runs some of them at full speed (parts.GENERATE_SIDES).
AGAIN_CALLS = 3


def repeat_name(call: str, n: int) -> str:
    """The name of the n-th run (from 1) of a row-2 call: "again", "again 2", ...; `call_of` reads it back."""
    return call if n == 1 else f"{call} {n}"


def call_of(name: str) -> str:
    """The call a row-2 call name repeats ("again 2" -> "again")."""
    return name.split(" ")[0]


@dataclass(frozen=True)
class Plan:
    """What one run measures: the parts, the mode's sizes, and the budget."""

    parts: tuple[str, ...]
    quick: bool
    budget_s: float
    output: str | None
    generate_models: tuple[str, ...]
    finetune_steps: int
    big_rounds: int
    native_turns: int
    # Fresh processes per side in rows 1-4 and 6 (None: parts.ROUNDS, and GENERATE_ROUNDS for row 2).
    processes: int | None = None

    def part_args(self, part: str) -> dict[str, Any]:
        """The JSON arguments a worker of `part` is given."""
        return {
            "first_calls": {"shapes": FIRST_CALL_SHAPES, "heads": (HEADS_Q, HEADS_KV, HEAD_DIM), "tiny": TINY,
                            "tiny_calls": TINY_CALLS},
            "finetune": {"config": FINETUNE, "batch": FINETUNE_BATCH, "lengths": FINETUNE_LENGTHS,
                         "steps": self.finetune_steps, "seed": SEED},
            "big_shape": {"shape": BIG_SHAPE, "rounds": self.big_rounds, "reps": 10},
            "first_step": {"shape": FIRST_STEP_SHAPE},
        }[part]


def parse_parts(text: str) -> tuple[str, ...]:
    """"all", or a comma list of row numbers (1-7) or part names; the parts, in PARTS order."""
    text = (text or "all").strip().lower()
    if text == "all":
        return tuple(PARTS)
    chosen = set()
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        found = [name for name, rows in PARTS.items() if item == name or (item.isdigit() and int(item) in rows)]
        if not found:
            raise argparse.ArgumentTypeError(f"unknown part {item!r}: use rows 1-7 or one of {', '.join(PARTS)}")
        chosen.update(found)
    if not chosen:
        raise argparse.ArgumentTypeError("no part chosen")
    return tuple(name for name in PARTS if name in chosen)


def parse_models(text: str) -> tuple[str, ...]:
    """A comma list of GENERATE's model names (each once, in GENERATE's order)."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in GENERATE]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--models={text!r}: use one or more of {', '.join(GENERATE)}")
    return tuple(name for name in GENERATE if name in names)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budget={text!r}: must be a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--budget={text!r}: must be more than 0 seconds")
    return value


def _processes(text: str) -> int:
    if not (text.isdigit() and int(text) % 2 == 1):
        raise argparse.ArgumentTypeError(f"--processes={text!r}: must be an odd whole number (each figure is a median)")
    return int(text)


def parse_args(argv: Sequence[str] | None, description: str = "") -> Plan:
    """The Plan of the command line (argparse exits with a message on bad input)."""
    parser = argparse.ArgumentParser(prog="python -m tools.bench_first_contact", description=description)
    parser.add_argument("-o", "--output", default=None, help="write the JSON document here")
    parser.add_argument("--quick", action="store_true",
                        help="fewer steps, rounds and turns; only the Llama model for generate()")
    parser.add_argument("--parts", type=parse_parts, default=tuple(PARTS),
                        help="rows 1-7 or part names, comma separated (default: all): " + ", ".join(
                            f"{name} ({'/'.join(map(str, rows))})" for name, rows in PARTS.items()))
    parser.add_argument("--processes", type=_processes, default=None,
                        help="fresh processes per side in rows 1-4 and 6 (default 3, row 2 9)")
    parser.add_argument("--models", type=parse_models, default=None,
                        help=f"row 2's models, comma separated: {', '.join(GENERATE)} (default: all; --quick: llama)")
    parser.add_argument("--budget", type=_positive, default=None,
                        help=f"seconds for the whole run (default {FULL_BUDGET_S:.0f}, --quick {QUICK_BUDGET_S:.0f})")
    args = parser.parse_args(argv)
    budget = args.budget or (QUICK_BUDGET_S if args.quick else FULL_BUDGET_S)
    return Plan(parts=args.parts, quick=args.quick, budget_s=budget, output=args.output,
                generate_models=args.models or (("llama",) if args.quick else tuple(GENERATE)),
                finetune_steps=5 if args.quick else 8, big_rounds=3 if args.quick else 7,
                native_turns=3 if args.quick else 10, processes=args.processes)


class Budget:
    """The run's deadline: how long the next process may run, or None when too little is left."""

    def __init__(self, seconds: float, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.deadline = clock() + seconds

    def left(self) -> float:
        return self.deadline - self.clock()

    def timeout(self, wanted: float, least: float = 10.0) -> float | None:
        """min(wanted, what is left); None when less than `least` seconds are left."""
        left = self.left()
        return None if left < least else min(wanted, left)
