"""Gateway metrics in a private Prometheus registry (never the process-global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hopline.budget import KiB, MiB


def body_buckets(limit: int) -> tuple[float, ...]:
    """Powers of four from 1 KiB, plus the limit itself so "at the limit" is its own bucket."""
    edges = {float(limit)}
    edge = KiB
    while edge < 4 * limit and edge <= 1024 * MiB:
        edges.add(float(edge))
        edge *= 4
    return (*sorted(edges), float("inf"))


class GatewayMetrics:
    def __init__(self, limit: int, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.body_bytes = Histogram(
            "hopline_gateway_request_body_bytes",
            "Request body bytes read by the gateway (a refused body counts what was read)",
            buckets=body_buckets(limit),
            registry=self.registry,
        )
        self.requests = Counter(
            "hopline_gateway_requests",
            "Gateway requests by response status",
            ["status"],
            registry=self.registry,
        )
        self.limit_bytes = Gauge(
            "hopline_gateway_body_limit_bytes", "The gateway's JSON body limit", registry=self.registry
        )
        self.limit_bytes.set(limit)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Counts every response by status and observes the body bytes each request read."""

    def __init__(self, app: ASGIApp, *, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        read = 0
        status = 500

        async def counting_receive() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
            return message

        async def status_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, counting_receive, status_send)
        finally:
            self.metrics.requests.labels(status=str(status)).inc()
            if scope.get("method") in ("POST", "PUT", "PATCH"):
                self.metrics.body_bytes.observe(read)
