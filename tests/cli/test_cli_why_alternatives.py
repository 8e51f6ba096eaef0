"""`why` lists what would work instead of each NONE: other problems, one or two fields away, that the
engine which answered supports. On CPU the bundled H100 snapshot answers, and every alternative it
lists is itself recorded there as supported (looked up again through a fresh selector)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusedattn_select import AttnConfig
from fusedattn_select.cli.main import main
from fusedattn_select.probing import choose_engine
from fusedattn_select.selection import alternatives
from fusedattn_select.selection.selector import Selector
from fusedattn_select.types import Outcome, Provenance

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(str(p) for p in (ROOT / "configs").glob("*.yaml"))
HOPPER_SUITE = str(ROOT / "probes" / "hopper-suite.yaml")


def _why_json(capsys, *args: str) -> dict:
    main(["why", "--json", "--target", "h100", *args])
    return json.loads(capsys.readouterr().out)


def _refused(result: dict) -> bool:
    selection = result["selection"]
    return selection["backend"] == "NONE" and any(v["outcome"] == Outcome.UNSUPPORTED.value
                                                  for v in selection["verdicts"])


def _assert_recorded_as_supported(engine, alternative: dict) -> None:
    """Each config of `alternative` answered again by a fresh selector over the same snapshot engine:
    its verdicts for the passes the alternative shows are supported and replayed from the recording."""
    shown = {v["phase"] for v in alternative["verdicts"]}
    for data in alternative["configs"]:
        answer = Selector(engine).select(AttnConfig.from_dict(data), alternative["verdicts"][0]["depth"])
        verdicts = [v for v in answer.verdicts if v.phase.value in shown]
        assert verdicts and all(v.supported for v in verdicts), (alternative["kind"], answer.message)
        assert {v.provenance for v in verdicts} == {Provenance.SNAPSHOT}


@pytest.mark.parametrize("source", ["configs", "hopper-suite"])
def test_every_refused_entry_lists_alternatives_recorded_as_supported(capsys, source):
    document = _why_json(capsys, *(CONFIGS if source == "configs" else [HOPPER_SUITE]))
    refused = [r for r in document["results"] if _refused(r)]
    assert refused, "the bundled snapshot holds refusals for these files"
    engine = choose_engine(None, "h100").engine
    for result in refused:
        search = result["alternatives"]
        assert search["found"], result["name"]
        assert 0 < len(search["found"]) <= alternatives.DEFAULT_LIMIT
        assert search["probes"] <= search["max_probes"] == alternatives.DEFAULT_MAX_PROBES
        for alternative in search["found"]:
            _assert_recorded_as_supported(engine, alternative)


def test_alternatives_are_other_problems_and_leave_the_answer_as_it_was(capsys):
    plain = _why_json(capsys, "--alternatives", "0", *CONFIGS)
    document = _why_json(capsys, *CONFIGS)
    for before, after in zip(plain["results"], document["results"]):
        for key in ("backend", "message", "reasons", "verdicts"):
            assert before["selection"][key] == after["selection"][key]
        for alternative in (after["alternatives"] or {}).get("found", []):
            assert alternative["changes"] and 1 <= len(alternative["changes"]) <= 2
            assert all(AttnConfig.from_dict(c).cache_key() != after["selection"]["cache_key"]
                       for c in alternative["configs"])


def test_answers_that_are_not_refusals_get_no_alternatives(capsys):
    document = _why_json(capsys, *CONFIGS)
    for result in document["results"]:
        if not _refused(result):
            assert result["alternatives"] is None and result["selection"]["alternatives"] == []


def test_the_probe_cap_is_respected_and_reported(capsys):
    document = _why_json(capsys, "--alternatives-max-probes", "2", *CONFIGS)
    refused = [r for r in document["results"] if _refused(r)]
    for result in refused:
        search = result["alternatives"]
        assert search["probes"] <= 2 and search["max_probes"] == 2
        assert result["selection"]["alternative_probes"] == search["probes"]
    assert any(r["alternatives"]["capped"] for r in refused)


def test_no_probes_are_spent_when_alternatives_are_off(capsys):
    document = _why_json(capsys, "--alternatives", "0", *CONFIGS)
    assert all(r["alternatives"] is None for r in document["results"])


def test_json_shape_of_an_alternative(capsys):
    document = _why_json(capsys, *CONFIGS)
    search = next(r["alternatives"] for r in document["results"] if _refused(r))
    assert set(search) == {"found", "probes", "max_probes", "capped"}
    alternative = search["found"][0]
    assert set(alternative) == {"kind", "changes", "backend", "answer", "extra_flops_percent", "note", "plan_form",
                                "provenance", "engine", "verdicts", "configs"}
    assert set(alternative["changes"][0]) == {"field", "asked", "instead"}
    assert alternative["engine"].startswith("snapshot:")


def test_text_lists_alternatives_as_other_problems_with_the_probe_count(capsys):
    main(["why", "--target", "h100", *CONFIGS])
    out = capsys.readouterr().out
    assert "what would work instead: OTHER problems, not an answer for this one" in out
    assert "candidate problems asked, at most 16" in out
    assert "1. bf16 instead of FP8 (qkv_dtype fp8_e4m3 -> bf16): F16" in out


@pytest.mark.parametrize("value", ["-1", "x", "1.5"])
def test_a_bad_cap_is_refused_naming_the_option(capsys, value):
    assert main(["why", "--target", "h100", "--alternatives-max-probes", value, *CONFIGS]) == 2
    assert "--alternatives-max-probes" in capsys.readouterr().err
