"""The daemon app under uvicorn for the benchmarks, with the switches the daemon lacks.

    python bench/daemon_server.py PORT DATA_DIR TOKEN [--no-observer] [--sidecars] -- AGENT_ARGV...

It builds the same app as ``hopline serve`` (``hopline.daemon.app.create_daemon_app`` with the
embedded gateway). The switches below exist only here, for A/B runs:

* ``--no-observer``: every pipe tap gets no hooks (no stats, no histogram, no large-frame
  observer); ``--no-histogram`` keeps the stats and the observer and leaves out the byte
  histogram. Both are the documented switches of :class:`hopline.observe.pipe.PipeObservability`
  (``hooks=False``, ``histogram=False``), handed to ``create_daemon_app(instruments=...)``;
* ``--journal-off`` (diagnostic only, it breaks SPEC D-5): event ids are assigned but events are
  not written (the writer thread still runs its empty transactions), to show how much of the
  relay's time the journal's writes take;
* ``--sidecars on|off``: ``create_daemon_app(sidecars=...)`` (the app's switch; ``hopline serve``
  has no flag for it), for the sidecar A/B.
"""

from __future__ import annotations

import argparse
import inspect
import secrets
import sys
from pathlib import Path
from typing import Any

import uvicorn

from hopline.budget import HOP_DAEMON_API, Budget
from hopline.cli._http_server import prepare_daemon_process, uvicorn_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("token")
    parser.add_argument("--no-observer", action="store_true", help="pipe taps get no hooks")
    parser.add_argument("--no-histogram", action="store_true",
                        help="pipe taps get stats and the large-frame observer, not the histogram")
    parser.add_argument("--sidecars", choices=("on", "off", "default"), default="default",
                        help="create_daemon_app(sidecars=...); default: the app's own default")
    parser.add_argument("--journal-off", action="store_true",
                        help="DIAGNOSTIC ONLY (breaks D-5): events get ids but are not written")
    parser.add_argument("--profile", type=Path, default=None,
                        help="profile with cProfile; SIGUSR1 writes the stats to this file")
    argv = sys.argv[1:]
    if "--" not in argv:
        parser.error("the agent command follows --")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    agent = argv[split + 1:]
    budget = Budget.from_env()

    from hopline.daemon import app as daemon_app
    from hopline.logs import configure_json_logging

    if args.journal_off:
        from hopline.store.sqlite_journal import SqliteJournal

        def write_nothing(self: Any, db: Any, rows: Any) -> None:  # ids still allocated, commits still settle
            return None

        SqliteJournal._insert_events = write_nothing  # type: ignore[method-assign]

    from hopline.observe.pipe import PipeObservability

    kwargs: dict[str, Any] = {"instruments": PipeObservability(budget, hooks=not args.no_observer,
                                                               histogram=not args.no_histogram)}
    if args.sidecars != "default":
        if "sidecars" in inspect.signature(daemon_app.create_daemon_app).parameters:
            kwargs["sidecars"] = args.sidecars == "on"
        elif args.sidecars == "on":  # an older app without the switch: plug the projector in here
            from hopline.daemon.projection import oversize_replacement
            from hopline.sidecars import SidecarStore, sidecar_projector

            store = SidecarStore(args.data_dir / "sidecars", budget)
            kwargs["projector"] = sidecar_projector(store, budget, then=oversize_replacement(budget))

    configure_json_logging()  # as `hopline serve`: large-frame records really get logged
    args.data_dir.mkdir(parents=True, exist_ok=True)
    app = daemon_app.create_daemon_app(budget, data_dir=args.data_dir, agent_cmd=agent,
                                       server_token=args.token, internal_token=secrets.token_hex(16),
                                       gateway_url=f"http://127.0.0.1:{args.port}", **kwargs)
    # the config `hopline serve` runs (its protocol with the head deadline and connection ceiling)
    server = uvicorn.Server(uvicorn_config(app, budget, HOP_DAEMON_API, host="127.0.0.1", port=args.port,
                                           log_level="warning"))
    prepare_daemon_process()  # as `hopline serve`
    if args.profile is None:
        server.run()
        return
    import cProfile
    import signal

    profiler = cProfile.Profile()
    signal.signal(signal.SIGUSR1, lambda *_: profiler.dump_stats(str(args.profile)))
    profiler.enable()
    server.run()


if __name__ == "__main__":
    main()
