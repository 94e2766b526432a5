"""The wire between engines and the sidecar: the protobuf codec and its checks.

The generated code (:mod:`specctl.api`) is read and written here and at the
gRPC edges (the engine's client, the sidecar's servicers, the command line);
the policies, the decision log and replay work on the plain types of
:mod:`specctl.steps` and :mod:`specctl.arms`.
"""
