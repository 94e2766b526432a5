"""Traces of a real engine: what every request drafted and accepted, step by step.

The engine writes them (:mod:`specctl.trace.writer`, enabled with
``SPECCTL_TRACE_DIR``); the simulator replays them
(:mod:`specctl.sim.trace_world`). :mod:`specctl.trace.format` is the
schema and the reader both sides share.
"""
