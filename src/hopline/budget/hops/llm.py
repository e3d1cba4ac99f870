"""An llm-turn's way: the agent's engine (hop 3), the gateway and its provider (hop 4)."""

from __future__ import annotations

from hopline.budget.ceiling import KiB, MiB
from hopline.budget.declare import Bytes, Count, HopSettings, Seconds, limit
from hopline.errors import HOP_ENGINE, HOP_GATEWAY, HOP_PROVIDER


class EngineLimits(HopSettings, hop=HOP_ENGINE):
    """Hop 3: the agent's llm-turn requests to the gateway."""

    transport_max_body_bytes: Bytes = limit(8 * MiB, "HOPLINE_TRANSPORT_MAX_BODY_BYTES",
                                            "engine transport ceiling for one llm-turn body")
    model_retry_attempts: Count = limit(3, "HOPLINE_MODEL_RETRY_ATTEMPTS",
                                        "retries of a transient model-origin failure", ge=0, le=10)
    model_retry_backoff_seconds: Seconds = limit(0.2, "HOPLINE_MODEL_RETRY_BACKOFF",
                                                 "first backoff of a model retry (doubles)", ge=0)


class GatewayLimits(HopSettings, hop=HOP_GATEWAY):
    """Hop 4: the gateway's llm-turn endpoint."""

    api_json_body_limit: Bytes = limit(10 * MiB, "API_JSON_BODY_LIMIT",
                                       "gateway JSON body limit, enforced while reading")
    scripted_max_tools_per_iteration: Count = limit(64, "HOPLINE_SCRIPTED_MAX_TOOLS_PER_ITERATION",
                                                    "scripted model hint toolsPerIteration")
    scripted_max_iterations: Count = limit(1000, "HOPLINE_SCRIPTED_MAX_ITERATIONS",
                                           "scripted model hint iterations")
    scripted_max_write_bytes: Bytes = limit(256 * KiB, "HOPLINE_SCRIPTED_MAX_WRITE_BYTES",
                                            "scripted model hint writeBytes (one write_file's content)")


class ProviderLimits(HopSettings, hop=HOP_PROVIDER):
    """Hop 4: the gateway's calls to its provider."""

    provider_connect_timeout_seconds: Seconds = limit(10.0, "HOPLINE_PROVIDER_CONNECT_TIMEOUT",
                                                      "provider connect timeout", ge=0.001)
    provider_read_timeout_seconds: Seconds = limit(120.0, "HOPLINE_PROVIDER_READ_TIMEOUT",
                                                   "provider read timeout", ge=0.001)
    provider_response_max_bytes: Bytes = limit(10 * MiB, "HOPLINE_PROVIDER_RESPONSE_MAX_BYTES",
                                               "one provider answer, read by the gateway")
    provider_stream_max_bytes: Bytes = limit(64 * MiB, "HOPLINE_PROVIDER_STREAM_MAX_BYTES",
                                             "raw bytes of one streamed answer, framing included (provider "
                                             "SSE, gateway NDJSON)")
