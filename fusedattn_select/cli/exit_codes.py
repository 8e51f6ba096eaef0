"""Exit codes of every command."""

EXIT_SELECTED = 0  # every answered problem has a fused backend (or the command has no answers)
EXIT_NONE = 1  # some problem has none (NONE)
EXIT_BAD_INPUT = 2  # a config, snapshot or option the command cannot use; one `error:` line on stderr
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as shells report it
