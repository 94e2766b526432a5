"""The decision log: every applied decision and what came of it, as Parquet."""

from specctl.decisionlog.reader import DecisionLog, LogInputError, LogProblem, read_decision_log
from specctl.decisionlog.schema import SCHEMA, SCHEMA_VERSION, batch_to_table
from specctl.decisionlog.writer import DecisionLogConfig, DecisionLogMetrics, DecisionLogWriter

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "DecisionLog",
    "DecisionLogConfig",
    "DecisionLogMetrics",
    "DecisionLogWriter",
    "LogInputError",
    "LogProblem",
    "batch_to_table",
    "read_decision_log",
]
