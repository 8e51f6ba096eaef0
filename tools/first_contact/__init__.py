"""First contact, side by side (`python -m tools.bench_first_contact`): every "done when" row of issue 34
measured in one run, each side in a fresh process with an empty store.

Modules: `options` (arguments, the workloads, the time budget), `processes` (fresh processes, and
the long-lived ones of the compiled-code turns), `worker` (the entry point of every measuring
process), `sides` (what "ours", "flash" and "default" run; timing), `kernels` (rows 1, 4, 5, 6:
attention alone), `models` (rows 2, 3, 7: transformers models), `parts` and `native_turns` (the
parent's side of each part), `targets` (the done-when verdicts and the markdown table).

No module imports torch, transformers or fusedattn_select at import time: a worker's imports are
part of what row 6 times, and the pure parts (arguments, verdicts, table) run without a GPU.
"""
