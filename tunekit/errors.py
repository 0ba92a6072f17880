"""User-facing errors: one sentence (what, where, what to do), exit code 2."""

from __future__ import annotations


class TunekitError(Exception):
    """A problem with the user's input or environment; the CLI prints it and exits with 2."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(TunekitError):
    """A recipe, override, profile or search space is malformed."""


class NotImplementedKnob(TunekitError):
    """A knob the config accepts but this build cannot run yet."""
