"""The ACP pipe, sans-IO (SPEC W): the NDJSON codec, JSON-RPC message kinds and pipe hooks.

Nothing in this package does I/O; the daemon and the agent own the pipes and feed bytes in.
"""
