"""`hopline frames`: large-frame attribution over an NDJSON capture of one pipe direction.

Reads the capture in chunks through the product's codec, stats and large-frame observer (same
budget, same sampling), prints each large-frame record as a JSON line, then one summary line
``{"stats": ..., "largeFrames": ..., "errors": ...}``.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from hopline.cli._common import budget_or_exit


def analyze(stream: Any, *, direction: str, budget: Any, threshold: int | None,
            emit: Any) -> dict[str, Any]:
    """Feed ``stream`` (binary, ``read(n)``) through codec, stats and observer; return the summary."""
    import logging

    from hopline.observe.large_frames import LargeFrameObserver
    from hopline.observe.stats import PipeStats
    from hopline.wire.ndjson import (
        READ_CHUNK_BYTES,
        Frame,
        FrameTooLarge,
        IncompleteFrame,
        InvalidFrame,
        NdjsonDecoder,
    )

    approx_budget = budget.large_frame_threshold_bytes  # --threshold is for analysis only
    if threshold is not None:
        budget = budget.replace(large_frame_threshold_bytes=threshold)
    quiet = logging.getLogger("hopline.cli.frames")  # the records go to stdout, not to the log
    quiet.propagate = False
    quiet.addHandler(logging.NullHandler())
    observer = LargeFrameObserver(budget, logger=quiet, approx_budget_bytes=approx_budget)
    stats = PipeStats()
    decoder = NdjsonDecoder.for_budget(budget)
    errors = {"frameTooLarge": 0, "invalidFrame": 0, "incompleteFrame": 0}
    error_keys = {FrameTooLarge: "frameTooLarge", InvalidFrame: "invalidFrame",
                  IncompleteFrame: "incompleteFrame"}

    def handle(items: list[Any]) -> None:
        for item in items:
            if isinstance(item, Frame):
                stats.record(direction, item.size)  # type: ignore[arg-type]
                record = observer.observe(direction, item.size, item.message)
                if record is not None:
                    emit(record)
            else:
                errors[error_keys[type(item)]] += 1
                stats.record_dropped(direction, item.size)  # type: ignore[arg-type]
                print(f"hopline frames: {item.describe()}", file=sys.stderr)

    while True:
        chunk = stream.read(READ_CHUNK_BYTES)
        if not chunk:
            break
        handle(decoder.feed(chunk))
    handle(decoder.eof())
    return {"stats": stats.snapshot(), "largeFrames": observer.snapshot(), "errors": errors}


def register(app: typer.Typer) -> None:
    @app.command()
    def frames(
        file: str = typer.Argument("-", help="NDJSON capture of one pipe direction, or - for stdin."),
        direction: str = typer.Option("inbound", "--direction",
                                      help="inbound (child -> daemon) or outbound (daemon -> child)."),
        threshold: str | None = typer.Option(None, "--threshold",
                                             help="Lower the large-frame threshold for this analysis "
                                                  "(e.g. 64KiB)."),
    ) -> None:
        """Attribute the large frames of a pipe capture; print records and a summary as JSON lines."""
        import orjson

        from hopline.budget import BudgetError, parse_size

        if direction not in ("inbound", "outbound"):
            print(f"hopline frames: --direction must be inbound or outbound, got {direction!r}",
                  file=sys.stderr)
            raise typer.Exit(2)
        budget = budget_or_exit()
        threshold_bytes: int | None = None
        if threshold is not None:
            try:
                threshold_bytes = parse_size(threshold)
                budget.replace(large_frame_threshold_bytes=threshold_bytes)
            except (ValueError, BudgetError) as exc:
                print(f"hopline frames: bad --threshold: {exc}", file=sys.stderr)
                raise typer.Exit(2) from None

        out = sys.stdout

        def emit(record: dict[str, Any]) -> None:
            out.write(orjson.dumps(record).decode() + "\n")

        try:
            if file == "-":
                summary = analyze(sys.stdin.buffer, direction=direction, budget=budget,
                                  threshold=threshold_bytes, emit=emit)
            else:
                with open(file, "rb") as stream:
                    summary = analyze(stream, direction=direction, budget=budget,
                                      threshold=threshold_bytes, emit=emit)
        except OSError as exc:
            print(f"hopline frames: cannot read {file}: {exc.strerror}", file=sys.stderr)
            raise typer.Exit(2) from None
        emit(summary)
        out.flush()
