"""Traces of a real engine: what every request drafted and accepted, step by step.

The engine writes them (:mod:`controller.trace.writer`, enabled with
``SPECCTL_TRACE_DIR``); the simulator replays them
(:mod:`controller.sim.trace_world`). :mod:`controller.trace.format` is the
schema and the reader both sides share.
"""
