"""Whether native code may be loaded from a path: serialized cuDNN plans and the compiled module.

Loading either runs code as the current user, so whoever can replace the file, or rename one of
the directories above it, could run code as that user. The rule (OpenSSH's StrictModes, applied to
the whole path after symbolic links are resolved):
- the file and every directory from it up to the directory the library owns (the cache directory,
  the compiled modules' directory) are owned by this user and writable by no one else;
- every directory above that is owned by this user or by root, and writable by no one else unless
  it is sticky (as /tmp is: others may not rename or remove what this user owns there).
Components that do not exist yet are skipped (nothing can be loaded from them).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable


def untrusted_reason(path: Path, owned_root: Path, companions: Iterable[Path] = ()) -> str:
    """Why native code must not be loaded from `path` ("" when it may); see the module docstring.
    `companions` are files read together with `path` (a database's -wal and -shm), held to the same
    rule; the reason names the file or directory that breaks it."""
    current_user = getattr(os, "geteuid", None)
    if current_user is None:  # Windows: no POSIX owners or modes to check
        return ""
    uid = current_user()
    # Both the path as written and as resolved: a symbolic link is as safe as the directory holding it.
    chains = [(Path(resolve(leaf)), Path(resolve(owned_root)))
              for leaf in (path, *companions) for resolve in (os.path.abspath, os.path.realpath)]
    owned: set[Path] = set()
    components: dict[Path, None] = {}
    for leaf, root in chains:
        owned.update((leaf, leaf.parent))
        owned.update(p for p in leaf.parents if p == root or root in p.parents)
        components.update(dict.fromkeys((leaf, *leaf.parents)))
    for component in components:
        try:
            info = os.stat(component)
        except FileNotFoundError:
            continue
        except OSError as err:
            return f"{component} cannot be checked ({err.strerror or err})"
        if component in owned:
            if info.st_uid != uid:
                return f"{component} is owned by uid {info.st_uid}, not by this user (uid {uid})"
        elif info.st_uid not in (uid, 0):
            return f"{component} is owned by uid {info.st_uid}, neither this user (uid {uid}) nor root"
        sticky_directory = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and (component in owned or not sticky_directory):
            return f"{component} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    return ""
