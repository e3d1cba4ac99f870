"""Observability of the ACP pipe (SPEC O): per-direction stats, the byte histogram and the
large-frame observer. Pure: no I/O besides the ``logging`` call of the large-frame records."""
