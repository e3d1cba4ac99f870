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
  has no flag for it), for the sidecar A/B;
* ``--memory-probe PATH`` (the memory benchmark): each SIGUSR1 collects garbage and appends one JSON
  line to PATH: the process's RSS and, with ``--tracemalloc``, tracemalloc's traced total and the
  allocation sites that grew most since the first probe (tracing from the app's start, once imported).
"""

from __future__ import annotations

import argparse
import inspect
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from hopline.budget import HOP_DAEMON_API, Budget
from hopline.http.server import prepare_daemon_process, uvicorn_config


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
    parser.add_argument("--memory-probe", type=Path, default=None,
                        help="SIGUSR1 appends the RSS (and tracemalloc's figures) to this file")
    parser.add_argument("--tracemalloc", action="store_true", help="trace allocations from the start")
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
    if args.memory_probe is not None:  # traced from here: the imports are done (tracing them takes a minute)
        _memory_probe(args.memory_probe, tracing=args.tracemalloc)
    if args.profile is None:
        server.run()
        return
    import cProfile
    import signal

    profiler = cProfile.Profile()
    signal.signal(signal.SIGUSR1, lambda *_: profiler.dump_stats(str(args.profile)))
    profiler.enable()
    server.run()


PROBE_TOP_SITES = 25  # allocation sites listed per probe, most grown first
PROBE_FRAMES = 12  # frames kept per traced allocation (the site, and who called it)


def _memory_probe(path: Path, *, tracing: bool) -> None:
    """SIGUSR1: collect garbage, then append RSS (and tracemalloc's traced total, peak and the
    sites that grew most since the first probe) to ``path`` as one JSON line."""
    import gc
    import json
    import linecache
    import os
    import signal
    import tracemalloc

    if tracing:
        tracemalloc.start(PROBE_FRAMES)
    first: list[tracemalloc.Snapshot] = []
    page = os.sysconf("SC_PAGE_SIZE")

    native = _native_memory()

    def probe(*_: object) -> None:
        gc.collect()
        with open("/proc/self/statm") as statm:
            line: dict[str, Any] = {"rss": int(statm.read().split()[1]) * page, **native()}
        if tracing:
            # the probe's own: the snapshot, and the source lines a traceback's format reads
            ignore = [tracemalloc.Filter(False, tracemalloc.__file__),
                      tracemalloc.Filter(False, linecache.__file__)]
            snapshot = tracemalloc.take_snapshot().filter_traces(ignore)
            line["traced"] = sum(stat.size for stat in snapshot.statistics("filename"))
            line["peak"] = tracemalloc.get_traced_memory()[1]
            if first:
                grown = [stat for stat in snapshot.compare_to(first[0], "traceback") if stat.count_diff > 0]
                grown.sort(key=lambda stat: (-stat.count_diff, -stat.size_diff))
                line["grown"] = [{"bytes": stat.size_diff, "blocks": stat.count_diff,
                                  "where": stat.traceback.format(limit=PROBE_FRAMES)}
                                 for stat in grown[:PROBE_TOP_SITES]]
            else:
                first.append(snapshot)
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")

    signal.signal(signal.SIGUSR1, probe)


def _native_memory() -> Callable[[], dict[str, int]]:
    """What tracemalloc does not see: SQLite's own allocations (its page caches) and the C
    allocator's heap, in use and held free (glibc's ``mallinfo2``); empty where they are absent."""
    import ctypes
    import ctypes.util

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    try:
        sqlite = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
        sqlite.sqlite3_memory_used.restype = ctypes.c_int64
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = MallInfo2
    except (OSError, AttributeError):
        return dict

    def figures() -> dict[str, int]:
        info = libc.mallinfo2()
        return {"sqliteBytes": int(sqlite.sqlite3_memory_used()), "mallocInUse": int(info.uordblks),
                "mallocMapped": int(info.hblkhd), "mallocFree": int(info.fordblks)}
    return figures


if __name__ == "__main__":
    main()
