"""Decision and plan stores (placeholder until the persistent store lands)."""

from __future__ import annotations


def open_default_store():
    return None
