"""The `fusedattn-select` command: why, info, snapshot record, warmup, cache.

Exit codes (exit_codes.py): 0 every answered problem has a backend, 1 some problem has none
(NONE), 2 bad input (a config, snapshot or option the command cannot use; one `error:` line on
stderr).

One module per subcommand, each with one `register_*` function that main.COMMANDS lists; a new
subcommand is a new module and one entry there. engines.py chooses the probing engine and store,
problem_input.py reads the problems `why` answers, table.py renders every table.
"""

from fusedattn_select.cli.main import main

__all__ = ["main"]
