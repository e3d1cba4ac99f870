"""Where hopline's state lives (SPEC X): the store (SQLite by default, or PostgreSQL shared by several
daemons) and the sidecar bodies (files by default, or an S3-compatible bucket).

:mod:`.locations` parses ``HOPLINE_STORE_URL`` and ``HOPLINE_SIDECAR_URL``; :mod:`.postgres` holds the
schema (versioned migrations under an advisory lock) and the connections; :mod:`.blobs` the sidecar
bodies behind one interface (files, S3), streamed both ways.
"""
