"""Who may call the admin service: an interceptor in front of every ``SpecControllerAdmin`` call.

Admin calls are refused unless ``admin.enabled``; then a caller is let through
with a client certificate whose common name is in ``admin.client_cns`` (over
mutual TLS) or with the bearer token of ``admin.token_file``. The common name
is in the call's auth context, which gRPC gives the handler and not the
interceptor, so the interceptor wraps the admin handlers and checks before
they run, as grpc's examples/python/auth checks a signature before a call.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from specctl.api import ADMIN_SERVICE_NAME
from specctl.sidecar.config import AdminConfig
from specctl.sidecar.tls import parse_names, peer_common_names

ADMIN_DISABLED = "admin calls are disabled; set admin.enabled"
UNAUTHENTICATED = (
    "admin calls need metadata 'authorization: Bearer <token>' with the token in "
    "admin.token_file, or a client certificate whose CN is in admin.client_cns"
)


class AdminAuthInterceptor(grpc.aio.ServerInterceptor):
    """Lets an admin call through only when the caller is allowed; other services pass."""

    def __init__(self, config: AdminConfig, token: str) -> None:
        self.configure(config, token)

    def configure(self, config: AdminConfig, token: str) -> None:
        """Settings from a (re)loaded configuration: ``token`` is admin.token_file's content."""
        self.enabled = config.enabled
        self.client_cns = parse_names(config.client_cns)
        self.token = token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method  # type: ignore[attr-defined]
        if handler is None or not method.startswith(f"/{ADMIN_SERVICE_NAME}/"):
            return handler
        if handler.unary_unary is None:
            # fail closed: a streaming admin method would need a wrapper of its own
            raise RuntimeError(f"{method}: only unary admin methods are authorised")
        call = handler.unary_unary

        async def authorised(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await self.authorise(context)
            return await call(request, context)

        return grpc.unary_unary_rpc_method_handler(
            authorised,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    async def authorise(self, context: grpc.aio.ServicerContext) -> None:
        """Return if the caller may make admin calls; otherwise abort the call."""
        if not self.enabled:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, ADMIN_DISABLED)
        if self.client_cns and any(cn in self.client_cns for cn in peer_common_names(context)):
            return
        if self.token:
            metadata = dict(context.invocation_metadata() or ())
            given = str(metadata.get("authorization", ""))
            expected = f"Bearer {self.token}"
            if hmac.compare_digest(given.encode(), expected.encode()):
                return
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)
