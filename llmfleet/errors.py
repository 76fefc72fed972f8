"""Errors the CLI turns into a one-line message and an exit code."""


class LlmfleetError(Exception):
    """An error the operator can act on; the message says what to do."""

    exit_code = 1


class RefusedError(LlmfleetError):
    """The input is valid but what it asks for would not work (exit 2)."""

    exit_code = 2
