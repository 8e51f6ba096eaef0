"""The command line imports only the module of the subcommand asked for (cli/main.COMMANDS)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

cli_main = importlib.import_module("fusedattn_select.cli.main")  # (the package's `main` is the function)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, asked", [
    (["why", "configs/llama-3-8b.yaml"], "why"),
    (["-v", "why"], "why"),
    (["-vv", "cache", "info"], "cache"),
    (["why", "-v"], "why"),
    (["-h", "why"], None),        # help before the command lists every command
    (["--help"], None),
    (["--version"], None),
    ([], None),
    (["--", "why"], None),
    (["wh"], None),               # a mistyped command: argparse names the choices, all registered
])
def test_the_command_asked_is_the_first_argument_that_is_not_an_option(argv, asked):
    assert cli_main._command_asked(argv) == asked


def _modules_after(*argv: str) -> set[str]:
    code = ("import json, sys\nfrom fusedattn_select.cli import main\n"
            f"main({list(argv)!r})\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('fusedattn_select.cli.'))))")
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_info_imports_no_other_command_module():
    loaded = {m for m in _modules_after("info") if m.rsplit(".", 1)[1] in
              {module.rsplit(".", 1)[1] for module, _ in cli_main.COMMANDS.values()}}
    assert loaded == {"fusedattn_select.cli.info"}


def test_help_before_a_command_lists_every_command(capsys):
    assert cli_main.main(["-h", "why"]) == 0
    out = capsys.readouterr().out
    assert all(f"    {name}" in out for name in cli_main.COMMANDS)
