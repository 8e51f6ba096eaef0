"""Every module file of the package has its own name (issue 35, item 4): a name says which module it
is without its package, and no import needs an alias to tell two modules apart."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import fusedattn_select

ROOT = Path(fusedattn_select.__file__).parent
# Every package has these; they are named by their package, not by their file.
PACKAGE_FILES = {"__init__.py", "__main__.py"}


def _repeated_names(root: Path) -> dict[str, list[str]]:
    """The module file names found more than once under `root`, each with its paths."""
    paths = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if path.name not in PACKAGE_FILES and "__pycache__" not in path.parts:
            paths[path.name].append(path.relative_to(root).as_posix())
    return {name: found for name, found in paths.items() if len(found) > 1}


def test_no_two_package_modules_share_a_file_name():
    assert _repeated_names(ROOT) == {}


def test_the_check_finds_a_repeated_name(tmp_path):
    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "a" / "engine.py").write_text("")
    (tmp_path / "b" / "engine.py").write_text("")
    (tmp_path / "c" / "device.py").write_text("")
    assert _repeated_names(tmp_path) == {"engine.py": ["a/engine.py", "b/engine.py"]}
