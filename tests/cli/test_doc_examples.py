"""The command examples that README.md and docs/cli.md show with their output print that output.

A newcomer copies them: every `$ fusedattn-select ...` example of docs/cli.md that answers from the
bundled snapshots (`--target`) is run, and each line the doc shows (a line `...` stands for lines it
leaves out) must be printed, in that order. README's CPU example is shown whole: it must be printed
as it stands, with the notice of a machine without cudnn-frontend.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from fusedattn_select import cli

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```\n(.*?)^```", re.S | re.M)


def _command_examples(text: str) -> list[tuple[list[str], list[str]]]:
    """(argv after `fusedattn-select`, lines shown) of each fenced block that starts with `$ fusedattn-select`."""
    examples = []
    for block in FENCE.findall(text):
        lines = block.splitlines()
        if not lines or not lines[0].startswith("$ fusedattn-select "):
            continue
        command = lines.pop(0)[2:]
        while command.endswith("\\"):  # a command continued on the next line
            command = command[:-1] + lines.pop(0)
        examples.append((shlex.split(command)[1:], lines))
    return examples


def _shown_in_order(shown: list[str], printed: list[str]) -> list[str]:
    """The lines of `shown` (but `...`) that `printed` does not hold in that order."""
    missing, at = [], 0
    for line in shown:
        if line.strip() == "...":
            continue
        try:
            at = printed.index(line, at) + 1
        except ValueError:
            missing.append(line)
    return missing


CLI_EXAMPLES = [example for example in _command_examples((ROOT / "docs" / "cli.md").read_text())
                if "--target" in example[0]]


def test_cli_md_shows_examples_that_answer_from_the_bundled_snapshots():
    assert len(CLI_EXAMPLES) >= 2


@pytest.mark.parametrize("argv, shown", CLI_EXAMPLES, ids=[" ".join(argv)[:60] for argv, _ in CLI_EXAMPLES])
def test_a_cli_md_example_prints_the_lines_it_shows(capsys, argv, shown):
    cli.main(argv)
    printed = capsys.readouterr().out.splitlines()
    assert _shown_in_order(shown, printed) == [], "\n".join(printed)


def test_readme_cpu_example_prints_what_readme_shows(capsys):
    pytest.importorskip("yaml")
    try:
        import cudnn  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("cudnn-frontend is installed: README's example shows a machine without it")
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^    (fusedattn-select why --hf-config .*)$", readme, re.M).group(1)
    shown = next(block for block in FENCE.findall(readme) if block.startswith("no CUDA device")).splitlines()
    cli.main(shlex.split(command)[1:])
    printed = capsys.readouterr().out.splitlines()
    assert printed == shown
