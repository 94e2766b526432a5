"""Harnesses for the tests and benchmarks: real components driven from synchronous code.

A sidecar on a background thread, a scripted engine that talks to it over gRPC,
hypothesis strategies for engine messages, a vLLM scheduler driven without a
model runner, the tiny model it and the engine tests load, and vLLM's offline
engine on that model. Nothing in the sidecar or the engine plugin imports this
package.
"""
