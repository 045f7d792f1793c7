"""The ``chainweaver`` command's exit codes, the error every subcommand reports as one
line on stderr, and URLs as such a line may show them."""

from __future__ import annotations

EXIT_OK, EXIT_INVALID, EXIT_MISSING, EXIT_SERVE_FAILED = 0, 1, 2, 3
EXIT_USAGE = 2  # argparse's code for a command line that does not make sense
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: how a shell reports a reader that went away


class CommandError(Exception):
    """A problem to report as one line on stderr, with the exit code it deserves."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def redacted(url: str | None) -> str:
    """A URL without its password, in the user part or the query (``"no queue"`` for
    none): the one masking every command and log line uses."""
    from ..governance.state import masked_url

    return masked_url(url) if url else "no queue"
