"""The result document: its JSON schema, the markdown report, and writing both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from tools.bench.common import RESULT_STATUS_OK, SCHEMA, clean_json, fmt_num, is_ok, md_table, skipped
from tools.bench.options import SECTION_TITLES, SECTIONS
from tools.bench.sections import RENDERERS

STAT_KEYS = ("median", "p25", "p75", "min", "max", "n", "unit")


def validate_result(doc: Any) -> list[str]:
    """Problems with a bench.json document (empty list when it follows the schema)."""
    problems: list[str] = []
    if not isinstance(doc, Mapping):
        return ["document is not an object"]
    if doc.get("schema") != SCHEMA:
        problems.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    meta = doc.get("meta")
    if not isinstance(meta, Mapping):
        problems.append("meta missing")
    else:
        for key in ("device", "date_utc", "mode", "torch", "cudnn_backend", "cudnn_frontend", "driver"):
            if key not in meta:
                problems.append(f"meta.{key} missing")
    sections = doc.get("sections")
    if not isinstance(sections, Mapping):
        problems.append("sections missing")
        sections = {}
    for name in SECTIONS:
        section = sections.get(name)
        if not isinstance(section, Mapping):
            problems.append(f"sections.{name} missing")
            continue
        status = section.get("status")
        if not isinstance(status, str) or not (
                status == RESULT_STATUS_OK or status.startswith(("failed: ", "skipped: ", "partial: "))):
            problems.append(f"sections.{name}.status invalid: {status!r}")
    problems.extend(_check_stats(doc, "$"))
    if not isinstance(doc.get("wall_seconds"), (int, float)):
        problems.append("wall_seconds missing")
    return problems


def _check_stats(value: Any, path: str) -> list[str]:
    """Every object that has a 'median' must be a full stat object."""
    problems: list[str] = []
    if isinstance(value, Mapping):
        if "median" in value and "n" in value:
            missing = [k for k in STAT_KEYS if k not in value]
            if missing:
                problems.append(f"{path}: stat without {', '.join(missing)}")
            elif not (value["min"] <= value["median"] <= value["max"]):
                problems.append(f"{path}: median outside [min, max]")
        for key, item in value.items():
            problems.extend(_check_stats(item, f"{path}.{key}"))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problems.extend(_check_stats(item, f"{path}[{index}]"))
    return problems


def _header(doc: Mapping) -> list[str]:
    meta = doc.get("meta", {}) or {}
    return ["# fusedattn-select benchmark", "", md_table(("", ""), [
        ("device", meta.get("device", "n/a")),
        ("GPU", meta.get("gpu", "n/a")),
        ("driver", meta.get("driver", "n/a")),
        ("cuDNN backend", meta.get("cudnn_backend", "n/a")),
        ("cudnn-frontend", meta.get("cudnn_frontend", "n/a")),
        ("torch", meta.get("torch", "n/a")),
        ("fusedattn-select", meta.get("library", "n/a")),
        ("python", meta.get("python", "n/a")),
        ("date", meta.get("date_utc", "n/a")),
        ("run", f"{meta.get('mode', '?')} mode, {fmt_num(doc.get('wall_seconds'))} s wall, "
                f"budget {fmt_num(meta.get('budget_s'))} s"),
    ]), "", "Figures are `median [p25–p75]` over the repetitions (`median (min–max)` for 2-3, "
            "`(n=1)` for one); ratios divide two medians measured in this run. Nothing here is "
            "asserted: the benchmark reports.", ""]


def _section_lines(name: str, section: Mapping) -> list[str]:
    out = [f"## {SECTION_TITLES[name]}", ""]
    status = section.get("status", "")
    if not is_ok(status):
        out.append(f"**{status}**")
        out.append("")
    try:
        body = RENDERERS[name](section)
    except Exception as err:  # noqa: BLE001 -- a broken renderer must not lose the document
        body = f"(cannot render this section: {type(err).__name__}: {err})"
    if body:
        out.append(body)
        out.append("")
    for note in section.get("notes", []) or []:
        out.append(f"- {note}")
    if section.get("notes"):
        out.append("")
    return out


def render_markdown(doc: Mapping) -> str:
    sections = doc.get("sections", {}) or {}
    out = _header(doc)
    for name in SECTIONS:
        out += _section_lines(name, sections.get(name) or {"status": skipped("not run")})
    notes = doc.get("notes") or []
    if notes:
        out.append("## Notes")
        out.append("")
        out += [f"- {n}" for n in notes]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def write_outputs(doc: Mapping, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    problems = validate_result(doc)
    if problems:
        doc = dict(doc)
        doc["schema_problems"] = problems
    json_path, md_path = out / "bench.json", out / "bench.md"
    json_path.write_text(json.dumps(clean_json(doc), indent=1, sort_keys=False) + "\n")
    md_path.write_text(render_markdown(doc))
    return json_path, md_path
