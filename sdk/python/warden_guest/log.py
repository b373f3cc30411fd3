"""Structured log lines (the `log` import), tagged by the host with plugin, task and
session. The level helpers are best effort: without the `log` grant a line is dropped and
the plugin goes on."""

from __future__ import annotations

from . import _wit
from .errors import Error, call

LEVELS = ("trace", "debug", "info", "warn", "error")


def write(level: str, message: str) -> None:
    """Writes one line at `level` (one of `LEVELS`); raises when the host refuses it."""
    wit_log = _wit.require(_wit.log, "log")
    call(wit_log.write, getattr(wit_log.Level, level.upper()), message)


def _best_effort(level: str, message: str) -> None:
    try:
        write(level, message)
    except Error:
        pass


def trace(message: str) -> None:
    _best_effort("trace", message)


def debug(message: str) -> None:
    _best_effort("debug", message)


def info(message: str) -> None:
    _best_effort("info", message)


def warn(message: str) -> None:
    _best_effort("warn", message)


def error(message: str) -> None:
    _best_effort("error", message)
