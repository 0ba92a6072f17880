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


def error_record(e: BaseException, traceback_lines: list[str]) -> dict:
    """A failed process's record (``status``, ``message``, ``traceback``): a TunekitError is its sentence alone (the
    user's mistake, said once, no traceback); anything else is its type and text with the last traceback lines."""
    if isinstance(e, TunekitError):
        return {"status": "failed", "message": e.message}
    text = f"{type(e).__name__}: {e}"
    oom = type(e).__name__ == "OutOfMemoryError" or "out of memory" in text.lower()
    return {"status": "oom" if oom else "failed", "message": text[:500], "traceback": traceback_lines[-15:]}
