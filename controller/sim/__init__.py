"""A simulated vLLM engine, calibrated on measured sweeps, for benchmarks and tests.

The simulated engine samples arms with the engine's own compiled policy view,
reports through the real step-report encoding and validation, and is served by
the same policy book as a real engine; only the model forward pass is replaced
by draws from a measured table (see :mod:`specctl.sim.table`).
"""
