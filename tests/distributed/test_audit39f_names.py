"""agree() and warmup() given problems whose names collide: unnamed AttnConfigs that `describe`
alike (here gpt2's first entry and the same problem with dropout 0.1), as local warmup() takes them.

Real processes (this file run as a script, one per rank) over real torch.distributed gloo groups,
answering from the bundled H100 recording, which holds the first problem and not the second.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from pathlib import Path

import pytest

from tests.distributed import rank_processes

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "fusedattn_select" / "snapshots" / "h100-configs.json"
GPT2 = ROOT / "configs" / "gpt2.yaml"
LIMIT_S = 90


def run_ranks(tmp_path: Path, world: int = 2) -> list[dict]:
    return rank_processes.run_ranks(lambda rank: [__file__, str(rank), str(world), str(tmp_path)], tmp_path, world,
                                    LIMIT_S)


def test_unnamed_problems_that_describe_alike_each_keep_their_answer_on_every_rank(tmp_path):
    # agree() refused them ("names two different problems; names must be unique": the caller named
    # nothing), and warmup()'s agreement held one selection for the two (the later one's), so the
    # command line's no-data rows were read from the other problem's answer.
    results = run_ranks(tmp_path)
    for r in results:
        assert "error" not in r and r["warmup"] == r["expected"], r
        assert r["agree"] == r["warmup"] == r["expected"], r
        assert sorted(r["expected"].values()) == [["F16", False], ["NONE", True]], r
        assert r["no_data"] == [r["dropout_key"]], r
    assert results[0]["agree"] == results[1]["agree"]


# ----- one rank (run as a script) ------------------------------------------------------------------
def _main() -> None:
    rank, world, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    import torch.distributed as dist

    from fusedattn_select import distributed
    from fusedattn_select.cli.warmup_job import agreed_report
    from fusedattn_select.config_files import load_config_file
    from fusedattn_select.probing.snapshot import SnapshotEngine
    from fusedattn_select.selection.local_warmup import describe
    from fusedattn_select.selection.selector import Selector, set_default_selector

    set_default_selector(Selector(SnapshotEngine.load(H100), store=None))
    base = load_config_file(GPT2).entries[0].config
    dropout = dataclasses.replace(base, dropout=0.1)
    assert describe(base) == describe(dropout) and base.cache_key() != dropout.cache_key()
    dist.init_process_group("gloo", init_method=f"file://{out / 'init'}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    result: dict = {"dropout_key": dropout.cache_key(), "expected": {
        f"{describe(cfg)} [{cfg.cache_key()}]": ["F16" if cfg is base else "NONE", cfg is dropout]
        for cfg in (base, dropout)}}
    try:
        shared = distributed.warmup([dropout, base], depth="fast", timeout=20)
        result["warmup"] = {n: [s.backend.value, s.no_data] for n, s in shared.agreement.selections.items()}
        result["no_data"] = sorted(agreed_report(shared)[1])
        agreed = distributed.agree([base, dropout], timeout=20)
        result["agree"] = {n: [s.backend.value, s.no_data] for n, s in agreed.selections.items()}
    except Exception as err:  # noqa: BLE001 - the error each rank raises is the result
        result["error"] = f"{type(err).__name__}: {err}"
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    # gloo's threads can abort interpreter teardown; the result is written, so leave without it.
    os._exit(0)


if __name__ == "__main__":
    _main()
else:
    pytest.importorskip("torch.distributed")
