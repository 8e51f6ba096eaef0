"""Exit codes of every command.

Answers combine as "is every problem fused?": 1 when some problem has a NONE verdict (the answer
is no, whatever the others say), else 3 when some problem has no data (unknown), else 0. A warmup
whose saves failed exits 4 whatever its answers (its report still gives them): what it was run for,
answers that outlive it, did not happen. Bad input (2) stops a command before it answers anything.
"""

EXIT_SELECTED = 0  # every answered problem has a fused backend (or the command has no answers)
EXIT_NONE = 1  # some problem has none (NONE): a verdict, or a command that could not do what it was asked
EXIT_NOT_DONE = EXIT_NONE  # a command that could not do (all of) what it was asked; the reason is on stderr
EXIT_BAD_INPUT = 2  # a config, snapshot or option the command cannot use, or stdout it cannot write; one `error:` line
EXIT_NO_DATA = 3  # no problem has NONE, but some has no data (not in the snapshot): only a live probe can answer
EXIT_NOT_PERSISTED = 4  # the answers were given, but some could not be saved to the persistent store
EXIT_BROKEN_PIPE = 141  # stdout was closed by its reader (`| head`): 128 + SIGPIPE, as shells report it
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as shells report it

EPILOG = (
    "exit codes: 0 a backend is selected for every problem; 1 some problem has NONE (warmup: also no GPU to "
    "probe on and no snapshots asked for, a live cache that cannot keep the answers, or a rank that could not "
    "join its torchrun job; nothing was warmed); 2 bad input, or stdout that cannot be written; "
    "3 no problem has NONE but some has no data (not recorded in the snapshot: only a live probe "
    "can answer it) or (why, matrix, warmup, snapshot record) a failed probe; 4 (warmup) the answers were given but some could not be "
    "saved to the persistent "
    "cache: wins over 0, 1 and 3 (the report still shows every answer); 130 interrupted; 141 stdout "
    "was closed by its reader"
)


def answers_exit_code(fused: list[bool], no_data: list[bool]) -> int:
    """The exit code of a command's answers: `fused[i]` and `no_data[i]` describe problem i."""
    if any(not ok and not unknown for ok, unknown in zip(fused, no_data)):
        return EXIT_NONE
    return EXIT_NO_DATA if any(no_data) else EXIT_SELECTED
