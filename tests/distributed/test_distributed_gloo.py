"""Agreement and shared warmup across 2 and 4 CPU processes (gloo), answering from recorded snapshots.

Each test starts WORLD processes running gloo_rank.py (a fresh interpreter per rank, a file://
rendezvous) and reads what every rank found. The snapshots are the bundled recordings of an H100
and an H200; the "edited" snapshot is a copy of the H100 recording with one verdict changed to a
rejection: a format fixture derived from the real one, standing for a rank whose platform rejects
a problem the others accept.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed import rank_processes

pytest.importorskip("torch.distributed")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SNAPSHOTS = ROOT / "fusedattn_select" / "snapshots"
H100, H200 = SNAPSHOTS / "h100-configs.json", SNAPSHOTS / "h200-configs.json"
LLAMA = ROOT / "configs" / "llama-3-8b.yaml"
LLAMA_FP8 = ROOT / "configs" / "llama-3-8b-fp8.yaml"
REJECTED = "llama-3-8b/train-bf16"
TIMEOUT_S = 90


def run_ranks(tmp_path: Path, scenario: str, world: int, **spec) -> list[dict]:
    """Run `scenario` on `world` gloo ranks; every rank's result, in rank order."""
    out = tmp_path / f"out-{scenario}-{world}"
    out.mkdir()
    spec.setdefault("configs", [str(LLAMA), str(LLAMA_FP8)])
    spec = {k: [str(p) for p in v] if k in ("snapshots", "stores") else v for k, v in spec.items()}
    init = tmp_path / f"init-{scenario}-{world}"
    return rank_processes.run_ranks(
        lambda rank: [str(HERE / "gloo_rank.py"), scenario, str(rank), str(world), str(init), str(out), json.dumps(spec)],
        out, world, TIMEOUT_S)


def edited_snapshot(tmp_path: Path, name: str = REJECTED) -> Path:
    """The H100 recording with `name`'s forward verdict turned into a check_support rejection."""
    suite, _, entry_name = name.partition("/")
    data = json.loads(H100.read_text())
    entry = next(e for e in data["entries"] if e["suite"] == f"{suite}.yaml" and e["name"] == entry_name)
    forward = next(v for v in entry["verdicts"] if v["phase"] == "forward")
    forward.update(outcome="unsupported", stage="check_support", message="rejected in the edited copy")
    path = tmp_path / "h100-configs-edited.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_on_one_platform_agree_and_keep_their_answers(tmp_path, world):
    results = run_ranks(tmp_path, "agree", world, snapshots=[H100])
    assert all(not r["disagreements"] and not r["mixed_platforms"] for r in results)
    assert all(r["selections"] == results[0]["selections"] for r in results)
    assert results[0]["selections"][REJECTED][0] == "F16"
    assert results[0]["selections"]["llama-3-8b-fp8/train-mxfp8"][0] == "NONE"  # a recorded rejection stays


@pytest.mark.parametrize("world", [2, 4])
def test_one_rank_whose_snapshot_rejects_a_problem_makes_every_rank_answer_none_naming_it(tmp_path, world):
    edited = edited_snapshot(tmp_path)
    results = run_ranks(tmp_path, "agree", world, snapshots=[H100, edited])  # odd ranks: edited copy
    odd = ", ".join(str(r) for r in range(1, world, 2))
    for rank, r in enumerate(results):
        backend, message = r["selections"][REJECTED]
        assert backend == "NONE"
        assert "ranks disagree" in message and "rejected in the edited copy" in message
        assert f"rank{'s' if world > 2 else ''} {odd} on NVIDIA H100 80GB HBM3" in message
        assert "snapshot:h100-configs-edited.json" in message and "snapshot:h100-configs.json]: F16" in message
        assert r["later"][REJECTED] == [backend, message], "select() after agree() must return the agreed NONE"
        assert [d[0] for d in r["disagreements"]] == [REJECTED]
        # The other problems agree and keep each rank's own answer.
        assert r["selections"]["llama-3-8b/prefill"][0] == "F16"
    assert len({r["selections"][REJECTED][1] for r in results}) == 1


def test_ranks_on_different_gpus_with_the_same_answers_are_reported_not_merged(tmp_path):
    # llama-3-8b.yaml only: the two recordings answer it the same (its FP8 file's backward verdicts
    # differ where one recording verified FP8 backwards and the other, older, did not).
    results = run_ranks(tmp_path, "agree", 2, snapshots=[H100, H200], configs=[str(LLAMA)])
    for r in results:
        assert r["mixed_platforms"] and not r["disagreements"]
        assert [p[0] for p in r["platforms"]] == [[0], [1]]
        assert "NVIDIA H100 80GB HBM3" in r["platforms"][0][1] and "NVIDIA H200" in r["platforms"][1][1]
        assert r["selections"][REJECTED][0] == "F16"
    assert results[0]["selections"] == results[1]["selections"]


def test_strict_agreement_answers_none_for_ranks_on_different_gpus(tmp_path):
    results = run_ranks(tmp_path, "agree", 2, snapshots=[H100, H200], strict=True)
    for r in results:
        backend, message = r["selections"][REJECTED]
        assert backend == "NONE" and "different platforms (strict)" in message
        assert "rank 0 on NVIDIA H100" in message and "rank 1 on NVIDIA H200" in message
        assert r["later"][REJECTED][0] == "NONE"


@pytest.mark.parametrize("world", [2, 4])
def test_a_rank_that_raises_makes_every_rank_raise_naming_it(tmp_path, world):
    failing = world - 1
    results = run_ranks(tmp_path, "agree", world, snapshots=[H100], fail_rank=failing, fail_problem=REJECTED)
    for r in results:
        assert r["failed_ranks"] == [failing], r
        assert r["step"] == "agreement"
        assert f"failed on rank {failing}" in r["error"] and "RuntimeError: injected failure while probing" in r["error"]


def test_a_rank_that_never_arrives_makes_the_others_raise_after_the_timeout(tmp_path):
    results = run_ranks(tmp_path, "absent", 2, snapshots=[H100], timeout=2)
    assert results[1] == {"skipped": True}
    # Rank 1 never calls: the package's gloo group (made with the timeout) cannot be formed.
    assert results[0]["step"] == "setup", results[0]
    assert "rank 0 gave up after waiting" in results[0]["error"] and "(timeout 2 s)" in results[0]["error"]


def test_the_timeout_holds_when_the_lowest_rank_is_the_one_missing(tmp_path):
    # Rank 0 stays alive (a stuck probe), so only the timeout can end rank 1's wait; in the job's own
    # gloo group (timeout 60 s) rank 1 waited until rank 0 returned.
    results = run_ranks(tmp_path, "lowest_stuck", 2, snapshots=[H100], timeout=2, stuck=12)
    assert results[0] == {"stuck": True}
    assert results[1]["waited"] < 8, results[1]
    assert "rank 1 gave up after waiting 2." in results[1]["error"] and "(timeout 2 s)" in results[1]["error"]


def test_leave_raises_after_the_timeout_when_a_rank_stays_away_and_still_destroys_the_groups(tmp_path):
    results = run_ranks(tmp_path, "leave_late", 2, snapshots=[H100], configs=[str(LLAMA)], timeout=2)
    assert results[1] == {"late": True}
    assert results[0]["raised"]["step"] == "leave" and "(timeout 2 s)" in results[0]["raised"]["error"]
    assert results[0]["waited"] < 4.5 and results[0]["initialized"] is False


def test_ranks_whose_versions_cost_the_work_differently_fail_at_the_start_naming_the_digests(tmp_path):
    results = run_ranks(tmp_path, "warmup", 2, snapshots=[H100], stores=[tmp_path / "node"], configs=[str(LLAMA)],
                        other_costs_rank=1)
    for r in results:
        assert r["step"] == "warmup start" and "split the same problems differently" in r["error"]
        assert "rank 0 work digest" in r["error"] and "rank 1 work digest" in r["error"]


@pytest.mark.parametrize("world,separate_stores", [(2, False), (4, True)])
def test_shared_warmup_probes_each_problem_once_and_every_rank_ends_with_every_decision(
        tmp_path, world, separate_stores):
    from fusedattn_select.probing.snapshot import SnapshotEngine
    from fusedattn_select.selection.local_warmup import warmup
    from fusedattn_select.selection.selector import Selector

    configs = [LLAMA, ROOT / "configs" / "gpt2.yaml"]
    stores = [tmp_path / f"node{r}" for r in range(world)] if separate_stores else [tmp_path / "node"]
    results = run_ranks(tmp_path, "warmup", world, snapshots=[H100], stores=stores,
                        configs=[str(c) for c in configs])

    # What one process warming everything alone probes.
    from fusedattn_select.config_files import load_config_file
    alone = Selector(SnapshotEngine.load(H100))
    named = [(f"{f.name}/{e.name}", e.config) for c in configs for f in [load_config_file(c)] for e in f.entries]
    warmup(named, depth="full", selector=alone, jobs=1)
    expected_probes = alone.cache_info()["probes"]

    assert sum(r["probes"] for r in results) == expected_probes > 0
    assert all(r["probes"] > 0 for r in results), "the work was split, not done by one rank"
    owned = [key for r in results for key in r["local_rows"]]
    assert len(owned) == len(set(owned)) == len({cfg.cache_key() for _, cfg in named})
    for r in results:
        assert r["probes_after_select"] == r["probes"], "a shared decision was probed again"
        assert all(from_cache for _, _, from_cache in r["later"].values())
        assert {n: v[:2] for n, v in r["later"].items()} == {n: v[:2] for n, v in results[0]["later"].items()}
        assert r["combined_rows"] == results[0]["combined_rows"] and r["agreed"] and not r["skipped"]
        assert r["decisions_received"] == len(owned) - len(r["local_rows"])
        assert r["failed_saves"][0] == 0


def test_a_shared_warmup_whose_saves_fail_on_one_rank_reports_them_on_every_rank(tmp_path):
    # Rank 1's store cannot be written (another connection holds its lock); the job did not keep what it
    # answered, so every rank's combined report counts those saves, and names the rank whose store failed.
    results = run_ranks(tmp_path, "warmup", 2, snapshots=[H100], stores=[tmp_path / "node0", tmp_path / "node1"],
                        configs=[str(LLAMA)], locked_rank=1)
    (count0, where0, own0), (count1, where1, own1) = (r["failed_saves"] for r in results)
    assert count0 == count1 > 0
    assert where1 == own1 and where0 == f"{own1} (rank 1)" and own0 != own1
    assert all(r["agreed"] for r in results)


def test_shared_warmup_with_a_rank_whose_snapshot_rejects_a_problem_disagrees_as_agree_does(tmp_path):
    edited = edited_snapshot(tmp_path)
    ranks = dict(snapshots=[H100, edited], configs=[str(LLAMA)])
    warmed = run_ranks(tmp_path, "warmup", 2, stores=[tmp_path / "node0", tmp_path / "node1"], **ranks)
    agreed = run_ranks(tmp_path, "agree", 2, **ranks)
    for w, a in zip(warmed, agreed):
        assert not w["agreed"] and [d[0] for d in w["disagreements"]] == [REJECTED]
        assert w["disagreements"] == a["disagreements"]
        assert w["later"][REJECTED][0] == "NONE" and w["disagreements"][0][1] in w["later"][REJECTED][1]
    # Each store holds what its own rank's engine answers, never the other rank's answer.
    assert warmed[0]["stored"][REJECTED][0] == "supported"
    assert warmed[1]["stored"][REJECTED][0] == "unsupported"


@pytest.mark.parametrize("argument,values", [("depth", ["full", "fast"]), ("agree", [True, False])])
def test_shared_warmup_with_ranks_called_differently_fails_before_any_work_naming_them(tmp_path, argument, values):
    results = run_ranks(tmp_path, "warmup", 2, snapshots=[H100], stores=[tmp_path / "node"], configs=[str(LLAMA)],
                        per_rank={argument: values})
    for r in results:
        assert r["step"] == "warmup start" and r["failed_ranks"] == [], r
        assert r["error"] == (f"distributed warmup start: ranks passed different {argument}: rank 0 {argument}="
                              f"{values[0]}; rank 1 {argument}={values[1]}; every rank must pass the same {argument}")


GPT2, BERT = str(ROOT / "configs" / "gpt2.yaml"), str(ROOT / "configs" / "bert-base.yaml")


@pytest.mark.parametrize("scenario", ["warmup", "agree"])
def test_ranks_given_the_same_problems_in_another_order_agree(tmp_path, scenario):
    results = run_ranks(tmp_path, scenario, 2, snapshots=[H100], stores=[tmp_path / "node"],
                        configs_by_rank=[[GPT2, BERT], [BERT, GPT2]])
    for r in results:
        assert "error" not in r and not r["disagreements"], r
        assert {n: v[0] for n, v in r["later"].items()} == {n: v[0] for n, v in results[0]["later"].items()}
    if scenario == "warmup":
        owned = [key for r in results for key in r["local_rows"]]
        assert len(owned) == len(set(owned)) == len(results[0]["later"])  # each problem warmed once


def test_shared_warmup_of_different_problems_fails_at_the_start_naming_them(tmp_path):
    results = run_ranks(tmp_path, "warmup", 2, snapshots=[H100], configs_by_rank=[[GPT2, BERT], [GPT2]])
    for r in results:
        assert r["step"] == "warmup start", r
        assert r["error"].startswith("distributed warmup start: ranks were given different problems: rank 0 has 14 "
                                     "problems and rank 1 5: 9 only on rank 0 (bert-base/"), r["error"]


@pytest.mark.parametrize("argument,values", [("strict", [True, False]), ("depth", ["fast", "full"])])
def test_agree_with_ranks_called_differently_raises_naming_them(tmp_path, argument, values):
    results = run_ranks(tmp_path, "agree", 2, snapshots=[H100, H200], configs=[str(LLAMA)],
                        per_rank={argument: values})
    for r in results:
        assert r["step"] == "agreement" and r["failed_ranks"] == [], r
        assert r["error"] == (f"distributed agreement: ranks passed different {argument}: rank 0 {argument}="
                              f"{values[0]}; rank 1 {argument}={values[1]}; every rank must pass the same {argument}")
