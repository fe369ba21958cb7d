"""Errors the CLI turns into one line on stderr and an exit code."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or usage: the message names what to fix. Exit code 2."""

    exit_code = 2


class MatrixError(UserError):
    """A problem in matrix.yaml, located by file, line and key."""

    def __init__(self, path: str, line: int | None, key: str, message: str):
        # One plain line whatever the input held: a key may hold a line break, an ANSI sequence or U+202E (escaped
        # as Python writes them, `\x1b`).
        key, message = ("".join(c if c.isprintable() else ascii(c)[1:-1] for c in text) for text in (key, message))
        self.path, self.line, self.key, self.detail = path, line, key, message
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


class FailedError(Exception):
    """A build or a test failed (not the user's input). Exit code 1."""

    exit_code = 1
