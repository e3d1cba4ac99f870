"""The daemon's HTTP routes, one module per resource: sessions, status (health, status, metrics),
the SSE stream; ``owner`` is the one rule that sends a write to the daemon that owns the session.
The gate routes are :func:`hopline.daemon.gates.gate_router`. :mod:`hopline.daemon.app` mounts them."""
