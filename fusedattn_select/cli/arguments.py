"""Argument types and options that more than one subcommand takes."""

from __future__ import annotations

import argparse

from fusedattn_select.types import ProbeDepth


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive integer")
    return value


def add_depth_option(parser: argparse.ArgumentParser, default: ProbeDepth) -> None:
    """`--depth {fast,full,verify}`; the command reads it back with ProbeDepth.parse."""
    parser.add_argument("--depth", choices=[d.value for d in ProbeDepth], default=default.value)

