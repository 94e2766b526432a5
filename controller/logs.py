"""Logging set-up for every specctl process: structlog, JSON in production.

Log lines are events with fields, never prose built from request data; prompt
text is never logged. Each module logs through ``get_logger(__name__)``, so a
line's ``component`` is the module that wrote it. ``format="auto"`` writes JSON unless stderr is a
terminal, where a person reads it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

FORMATS = ("auto", "json", "console")
LEVELS = ("debug", "info", "warning", "error")


def configure_logging(
    format: str = "auto", level: str = "info", *, route_stdlib: bool = True
) -> None:
    """Route structlog, and with ``route_stdlib`` the standard ``logging`` module, to stderr.

    The engine side runs inside vLLM, whose own logging it leaves alone
    (``route_stdlib=False``).
    """
    if format not in FORMATS:
        raise ValueError(f"log format {format!r} must be one of {', '.join(FORMATS)}")
    if level not in LEVELS:
        raise ValueError(f"log level {level!r} must be one of {', '.join(LEVELS)}")
    as_json = format == "json" or (format == "auto" and not sys.stderr.isatty())
    numeric_level = getattr(logging, level.upper())
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info if as_json else structlog.dev.set_exc_info,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    if route_stdlib:
        logging.basicConfig(
            stream=sys.stderr, level=max(numeric_level, logging.WARNING), force=True
        )


def get_logger(name: str) -> Any:
    """A structlog logger bound to ``component=name``; safe to create at import time.

    Every module takes its own: ``log = get_logger(__name__)``.
    """
    return structlog.get_logger(component=name)
