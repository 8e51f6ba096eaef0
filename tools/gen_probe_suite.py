#!/usr/bin/env python3
"""Generate the Hopper cuDNN fused-attention probe suite.

Writes ``probes/hopper-suite.yaml`` (every config) and ``probes/hopper-suite-sample.yaml``
(every 10th config, for quick GPU agreement tests) in the config-file format of ``configs/``:
``name``/``description``/``source``/``configs``. Each entry is complete (no ``defaults``), so a
suite entry can be copied anywhere on its own.

The generator is deterministic: no randomness, no clock, no environment; running it twice writes
byte-identical files. It needs PyYAML and the ``fusedattn_select`` package of this checkout (its
AttnConfig vocabulary and validation). Before writing, every entry is built with
``AttnConfig.from_dict`` and checked against the few suite rules the library does not make
(``check_suite_rules``), and names and configs are checked to be unique; a violation aborts
without writing anything.

Usage::

    python3 tools/gen_probe_suite.py                 # write probes/hopper-suite*.yaml
    python3 tools/gen_probe_suite.py --check         # generate + check, write nothing
    python3 tools/gen_probe_suite.py --check-configs configs/*.yaml
                                                     # check hand-written model files too

Sizes are kept modest (batch 2, 8-16 heads, sequence lengths 128-2048, decode seqlen_q 1) because
every config is probed on a GPU (a few ms each).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
# Run as `python3 tools/gen_probe_suite.py`, Python puts tools/ on sys.path, not the repository root,
# where the generator's modules (tools/probe_suite/) and this checkout's fusedattn_select live.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fusedattn_select.config_files import NamedConfig, parse_config_file  # noqa: E402 - after sys.path above
from fusedattn_select.errors import ConfigError  # noqa: E402
from tools.probe_suite.checks import ConfigProblem, check_config_file, check_entry, check_file, check_unique  # noqa: E402
from tools.probe_suite.families import build  # noqa: E402
from tools.probe_suite.output import coverage, render  # noqa: E402

SUITE_PATH = ROOT / "probes" / "hopper-suite.yaml"
SAMPLE_PATH = ROOT / "probes" / "hopper-suite-sample.yaml"
SAMPLE_EVERY = 10
MIN_CONFIGS = 320


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="generate and check; write nothing")
    parser.add_argument("--check-configs", nargs="*", metavar="YAML", help="check these config files and exit")
    args = parser.parse_args(argv)

    if args.check_configs is not None:
        total = 0
        for path in args.check_configs:
            n = check_config_file(Path(path))
            total += n
            print(f"ok {path}: {n} configs")
        print(f"ok: {len(args.check_configs)} files, {total} configs")
        return 0

    suite = build()
    entries = [{"name": name, **cfg} for name, cfg in suite.entries.items()]
    check_unique((NamedConfig(name, check_entry(name, cfg)) for name, cfg in suite.entries.items()),
                 "hopper-suite")
    if len(entries) < MIN_CONFIGS:
        raise ConfigProblem(f"only {len(entries)} configs; the suite needs at least {MIN_CONFIGS}")
    sample = entries[::SAMPLE_EVERY]
    summary = coverage(entries, suite.section_of)
    for line in summary:
        print(line)
    print(f"(skipped {suite.duplicates} duplicate configs; sample: {len(sample)} configs)")
    if args.check:
        return 0

    suite_text = render(
        "hopper-suite",
        "Hopper (sm90) cuDNN fused-attention probe suite: head dims, GQA/MQA, masks, windows, "
        "layouts, paged KV, FP8 recipes, bias, softmax variants, dropout, determinism",
        entries, summary,
    )
    sample_text = render(
        "hopper-suite-sample",
        f"Every {SAMPLE_EVERY}th config of probes/hopper-suite.yaml, for quick GPU agreement tests",
        sample, coverage(sample, suite.section_of),
    )
    # Round-trip both files through the library's config-file parser and the checker before writing.
    for text, where in ((suite_text, SUITE_PATH), (sample_text, SAMPLE_PATH)):
        try:
            reparsed = parse_config_file(yaml.safe_load(text), where.name)
        except ConfigError as err:
            raise ConfigProblem(str(err)) from None
        check_file(reparsed)
    SUITE_PATH.parent.mkdir(parents=True, exist_ok=True)
    SUITE_PATH.write_text(suite_text)
    SAMPLE_PATH.write_text(sample_text)
    print(f"wrote {SUITE_PATH.relative_to(ROOT)} ({len(entries)} configs) and "
          f"{SAMPLE_PATH.relative_to(ROOT)} ({len(sample)} configs)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigProblem as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
