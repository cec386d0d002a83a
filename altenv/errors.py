"""The error a user can fix: bad input, a busy run directory, damaged records.

The command line prints such an error as one line (``altenv: <message>``) and exits with
status 2; every other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Input the user can fix; the message names the field (or file and line) and what is
    allowed, in one line."""


class NothingMeasuredError(UserError):
    """Every candidate of a tuning failed to build, run or check; the message says how many
    and where their errors are."""
