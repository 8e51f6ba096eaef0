"""Native code (serialized plans, the compiled module) is loaded only from a path no one else can change."""

import os

import pytest

from fusedattn_select.trust import untrusted_reason

needs_posix = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user")


def _private_tree(tmp_path):
    root = tmp_path / "cache"
    (root / "native" / "mod").mkdir(parents=True)
    for directory in (tmp_path, root, root / "native", root / "native" / "mod"):
        os.chmod(directory, 0o700)
    module = root / "native" / "mod" / "mod.so"
    module.write_bytes(b"\x7fELF")
    os.chmod(module, 0o600)
    return root, module


@needs_posix
def test_a_private_path_is_trusted(tmp_path):
    root, module = _private_tree(tmp_path)
    assert untrusted_reason(module, root) == ""


@needs_posix
@pytest.mark.parametrize("level", ["file", "its directory", "the owned root"])
def test_a_group_writable_component_inside_the_owned_root_is_refused(tmp_path, level):
    root, module = _private_tree(tmp_path)
    target = {"file": module, "its directory": module.parent, "the owned root": root}[level]
    os.chmod(target, 0o770 if target.is_dir() else 0o660)
    assert untrusted_reason(module, root) == f"{target} is writable by group or others (mode {'770' if target.is_dir() else '660'})"


@needs_posix
def test_a_world_writable_directory_above_the_owned_root_is_refused_unless_sticky(tmp_path):
    root, module = _private_tree(tmp_path)
    os.chmod(tmp_path, 0o777)
    assert "writable by group or others (mode 777)" in untrusted_reason(module, root)
    os.chmod(tmp_path, 0o1777)  # as /tmp: others cannot rename what this user owns there
    assert untrusted_reason(module, root) == ""
    os.chmod(root, 0o1777)  # sticky does not excuse the directory the library owns
    assert "mode 1777" in untrusted_reason(module, root)


@needs_posix
def test_a_link_into_a_shared_directory_is_judged_by_where_it_leads(tmp_path):
    root, module = _private_tree(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    planted = shared / "mod.so"
    planted.write_bytes(b"\x7fELF")
    link = module.parent / "link.so"
    link.symlink_to(planted)
    assert f"{shared} is writable by group or others" in untrusted_reason(link, root)


@needs_posix
def test_missing_components_are_skipped(tmp_path):
    root, _ = _private_tree(tmp_path)
    assert untrusted_reason(root / "not-yet" / "decisions.sqlite3", root) == ""


@needs_root
def test_a_file_owned_by_another_user_is_refused(tmp_path):
    root, module = _private_tree(tmp_path)
    os.chown(module, 4321, -1)
    assert untrusted_reason(module, root) == f"{module} is owned by uid 4321, not by this user (uid 0)"


@needs_root
def test_a_directory_above_owned_by_another_user_is_refused(tmp_path):
    root, module = _private_tree(tmp_path)
    os.chown(tmp_path, 4321, -1)
    assert untrusted_reason(module, root) == f"{tmp_path} is owned by uid 4321, neither this user (uid 0) nor root"
