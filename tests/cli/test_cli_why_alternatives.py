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


def config_of(result: dict) -> AttnConfig:
    return AttnConfig.from_dict(result["selection"]["config"])


def _refused(result: dict) -> bool:
    selection = result["selection"]
    return selection["backend"] == "NONE" and any(v["outcome"] == Outcome.UNSUPPORTED.value
                                                  for v in selection["verdicts"])


def _assert_recorded_as_supported(engine, alternative: dict) -> None:
    """The problem that answers `alternative` (its config, or the recorded problem at the default scale
    a padded head dim is looked up as) answered again by a fresh selector over the same snapshot
    engine: every verdict supported and replayed from the recording."""
    data = alternative["answered_by"] or alternative["config"]
    answer = Selector(engine).select(AttnConfig.from_dict(data), alternative["verdicts"][0]["depth"])
    assert answer.selected, (alternative["kind"], answer.message)
    assert {v.provenance for v in answer.verdicts} == {Provenance.SNAPSHOT}
    # Answered earlier in the run or not, the alternative shows where its verdicts come from.
    assert alternative["provenance"] == [Provenance.SNAPSHOT.value]


@pytest.mark.parametrize("source", ["configs", "hopper-suite"])
def test_every_refused_entry_lists_alternatives_recorded_as_supported(capsys, source):
    document = _why_json(capsys, *(CONFIGS if source == "configs" else [HOPPER_SUITE]))
    refused = [r for r in document["results"] if _refused(r)]
    assert refused, "the bundled snapshot holds refusals for these files"
    engine = choose_engine(None, "h100").engine
    for result in refused:
        search = result["alternatives"]
        # The suite refuses some problems only a change of the result would fix (a bias, the max logit, a
        # softmax): those get none, after a search the cap did not cut short.
        assert search["found"] or (source == "hopper-suite" and not search["capped"]), result["name"]
        assert len(search["found"]) <= alternatives.DEFAULT_LIMIT
        assert search["probes"] <= search["max_probes"] == alternatives.DEFAULT_MAX_PROBES
        assert search["candidates"] >= len(search["found"])
        for alternative in search["found"]:
            _assert_recorded_as_supported(engine, alternative)


def test_alternatives_are_other_problems_and_leave_the_answer_as_it_was(capsys):
    plain = _why_json(capsys, "--alternatives", "0", *CONFIGS)
    document = _why_json(capsys, *CONFIGS)
    for before, after in zip(plain["results"], document["results"]):
        for key in ("backend", "message", "reasons", "verdicts"):
            assert before["selection"][key] == after["selection"][key]
        for alternative in (after["alternatives"] or {}).get("found", []):
            config = AttnConfig.from_dict(alternative["config"])
            assert alternative["changes"] and 1 <= alternatives.changed_fields(config_of(after), config) <= 2
            assert AttnConfig.from_dict(alternative["config"]).cache_key() != after["selection"]["cache_key"]


def test_answers_that_are_not_refusals_get_no_alternatives(capsys):
    document = _why_json(capsys, *CONFIGS)
    for result in document["results"]:
        if not _refused(result):
            assert result["alternatives"] is None


def test_alternatives_are_listed_once_per_result(capsys):
    document = _why_json(capsys, *CONFIGS)
    for result in document["results"]:
        assert "alternatives" not in result["selection"] and "alternative_probes" not in result["selection"]


def test_the_probe_cap_is_respected_and_reported(capsys):
    document = _why_json(capsys, "--alternatives-max-probes", "2", *CONFIGS)
    refused = [r for r in document["results"] if _refused(r)]
    for result in refused:
        search = result["alternatives"]
        assert search["probes"] <= 2 and search["max_probes"] == 2
    assert any(r["alternatives"]["capped"] for r in refused)


def test_no_probes_are_spent_when_alternatives_are_off(capsys):
    document = _why_json(capsys, "--alternatives", "0", *CONFIGS)
    assert all(r["alternatives"] is None for r in document["results"])


def test_json_shape_of_an_alternative(capsys):
    document = _why_json(capsys, *CONFIGS)
    search = next(r["alternatives"] for r in document["results"] if _refused(r))
    assert set(search) == {"found", "candidates", "probes", "max_probes", "capped"}
    alternative = search["found"][0]
    assert set(alternative) == {"kind", "changes", "backend", "extra_flops_percent", "note", "plan_form",
                                "provenance", "from_cache", "engine", "verdicts", "config", "answered_by"}
    assert set(alternative["changes"][0]) == {"field", "asked", "instead"}
    assert alternative["engine"].startswith("snapshot:")


def test_text_lists_alternatives_as_other_problems_with_the_probe_count(capsys):
    main(["why", "--target", "h100", *CONFIGS])
    out = capsys.readouterr().out
    assert "what would work instead: OTHER problems, not an answer for this one" in out
    assert "candidate problems asked, " in out and f"recorded rows read of at most {alternatives.DEFAULT_MAX_PROBES}" in out
    assert "1. bf16 instead of FP8 (qkv_dtype fp8_e4m3 -> bf16, " in out


def test_a_cap_of_zero_says_nothing_was_searched(capsys):
    main(["why", "--target", "h100", "--alternatives-max-probes", "0", *CONFIGS])
    lines = [line for line in capsys.readouterr().out.splitlines() if "what would work instead" in line]
    assert lines and set(lines) == {"  what would work instead: not searched (--alternatives-max-probes 0)"}


def test_why_help_says_alternatives_cost_probes(capsys):
    try:
        main(["why", "--help"])
    except SystemExit:
        pass
    out = " ".join(capsys.readouterr().out.split())
    assert "costs extra graph probes, up to --alternatives-max-probes" in out


@pytest.mark.parametrize("option", ["--alternatives", "--alternatives-max-probes"])
@pytest.mark.parametrize("value", ["-1", "x", "1.5", "\u00b2", "\u0663"])
def test_a_bad_count_is_refused_naming_the_option_and_what_is_allowed(capsys, option, value):
    assert main(["why", "--target", "h100", option, value, *CONFIGS]) == 2
    err = capsys.readouterr().err
    assert option in err and "whole number 0 or more" in err and "_count" not in err
