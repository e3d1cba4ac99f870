"""`hopline gateway`: serve the LLM gateway (SPEC G) with uvicorn on loopback.

The internal token comes from ``HOPLINE_INTERNAL_TOKEN``; without it one is generated
(``secrets.token_urlsafe``) and put in this process's environment, so children inherit it. The token
is never printed or logged: a generated one can be written to ``--token-file`` (mode 0600) for a
client outside this process tree.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import typer

from hopline.budget import INTERNAL_TOKEN_ENV
from hopline.cli._common import bind_or_exit, budget_or_exit, require_coherent_or_exit


def resolve_token(environ: dict[str, str] | os._Environ[str]) -> tuple[str, str]:
    """The token and where it came from; a generated one is exported for child processes."""
    token = environ.get(INTERNAL_TOKEN_ENV, "").strip()
    if token:
        return token, INTERNAL_TOKEN_ENV
    token = secrets.token_urlsafe(32)
    environ[INTERNAL_TOKEN_ENV] = token
    return token, "generated"


def register(app: typer.Typer) -> None:
    @app.command()
    def gateway(
        host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
        port: int = typer.Option(8787, help="Port to bind; 0 picks a free one."),
        token_file: Path | None = typer.Option(
            None, "--token-file", help="Write a generated token here (mode 0600)."),
    ) -> None:
        """Serve POST /internal/sessions/{sessionId}/llm-turn with the budget's body limit."""

        import uvicorn

        from hopline.budget import HOP_GATEWAY
        from hopline.daemon.embedded_gateway import gateway_provider, standalone_gateway
        from hopline.http.server import uvicorn_config

        budget = budget_or_exit()
        require_coherent_or_exit(budget, "gateway", show_warnings=True)  # as serve: HOPLINE_NAIVE=1 too
        try:
            provider = gateway_provider(budget)
        except ValueError as exc:
            print(f"hopline gateway: bad setting: {exc}", file=sys.stderr)
            raise typer.Exit(2) from None

        token, source = resolve_token(os.environ)
        if source == "generated" and token_file is not None:
            token_file.touch(mode=0o600, exist_ok=True)
            token_file.chmod(0o600)
            token_file.write_text(token)
        from hopline.logs import configure_json_logging

        configure_json_logging()

        sock = bind_or_exit(host, port, "gateway")
        # Listening before the line is printed: a client that reads it can connect at once.
        sock.listen(2048)
        bound_port = sock.getsockname()[1]
        shown_host = f"[{host}]" if ":" in host else host
        print(f"hopline gateway listening on http://{shown_host}:{bound_port}", flush=True)
        where = f" (written to {token_file})" if source == "generated" and token_file else ""
        print(f"hopline gateway: token from {source}{where}; provider {provider.name}; "
              f"body limit {budget.api_json_body_limit} bytes", file=sys.stderr, flush=True)

        app_ = standalone_gateway(budget, token=token, provider=provider)
        config = uvicorn_config(app_, budget, HOP_GATEWAY, log_level="warning")
        uvicorn.Server(config).run(sockets=[sock])
