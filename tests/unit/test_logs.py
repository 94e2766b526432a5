"""One logging convention: every module logs through specctl.logs.get_logger(__name__)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import structlog
from structlog.testing import capture_logs

from specctl.logs import configure_logging, get_logger

CONTROLLER = Path(__file__).resolve().parents[2] / "controller"
OTHER_LOGGERS = re.compile(r"structlog\.get_logger\(|logging\.getLogger\(|get_logger\([\"']")


def test_modules_take_their_logger_by_module_name() -> None:
    offenders = []
    for path in sorted(CONTROLLER.rglob("*.py")):
        rel = path.relative_to(CONTROLLER).as_posix()
        if rel == "logs.py" or rel.startswith("api/"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if OTHER_LOGGERS.search(line):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == []


def test_a_line_names_the_module_that_wrote_it() -> None:
    from specctl.engine import client
    from specctl.sidecar import admission

    with capture_logs() as logs:
        get_logger(__name__).info("here")
        client.log.info("engine_side")
        admission.log.info("sidecar_side")
    assert [(e["event"], e["component"]) for e in logs] == [
        ("here", __name__),
        ("engine_side", "specctl.engine.client"),
        ("sidecar_side", "specctl.sidecar.admission"),
    ]


def test_the_engine_set_up_leaves_the_standard_logging_alone() -> None:
    root = logging.getLogger()
    handlers, level, config = list(root.handlers), root.level, structlog.get_config()
    try:
        configure_logging("json", "debug", route_stdlib=False)  # what the engine calls
        assert (root.handlers, root.level) == (handlers, level)
        configure_logging("json", "info")  # the sidecar routes the standard logging too
        assert root.handlers != handlers
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**config)
