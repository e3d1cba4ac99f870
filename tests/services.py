"""Real services for the scale-out tests (SPEC X), started by the tests on 127.0.0.1 and stopped by them.

* :class:`PostgresCluster`: a throwaway PostgreSQL cluster (``initdb`` + ``pg_ctl``) in a temporary
  directory, password authentication on 127.0.0.1, one per test session; each test gets a fresh
  database (:meth:`PostgresCluster.fresh_database`), dropped after it. As root (CI), the server runs
  as the unprivileged ``postgres`` user (or ``nobody``): PostgreSQL refuses to run as root.
* :class:`S3Server`: moto's S3-compatible server (``moto[server]``) on a free port; each test gets a
  fresh bucket.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PG_USER = "hopline"
PG_PASSWORD = "pg-test-password-7f3a"  # a canary too: it must never reach a log or a child
HOW_TO_GET_POSTGRESQL = ("PostgreSQL is not installed (no pg_ctl on PATH or under "
                         "/usr/lib/postgresql/*/bin); install it with `apt-get install postgresql` "
                         "(.ci/run does this in CI)")


def postgres_bin_dir() -> Path | None:
    """The directory of ``pg_ctl`` and ``initdb``: PATH first, then Debian's versioned directories."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    def version(path: str) -> int:
        name = Path(path).parent.parent.name
        return int(name) if name.isdigit() else 0

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=version)
    return Path(candidates[-1]).parent if candidates else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresCluster:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.dir = Path(tempfile.mkdtemp(prefix="hopline-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self._names = itertools.count(1)
        self._demote: Callable[[], None] | None = None
        if os.geteuid() == 0:
            import pwd

            user = next((u for u in ("postgres", "nobody") if _has_user(u)), None)
            if user is None:
                raise RuntimeError("running as root with neither a postgres nor a nobody user")
            entry = pwd.getpwnam(user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)

            def demote() -> None:
                os.setgid(entry.pw_gid)
                os.setuid(entry.pw_uid)

            self._demote = demote
            self._owner = (entry.pw_uid, entry.pw_gid)
        else:
            self._owner = None  # type: ignore[assignment]

    def _run(self, *argv: str, env: dict[str, str] | None = None) -> None:
        subprocess.run(argv, check=True, preexec_fn=self._demote, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, cwd=self.dir, env=env)

    def start(self, extra_options: str = "") -> PostgresCluster:
        password_file = self.dir / "pw"
        password_file.write_text(PG_PASSWORD + "\n")
        if self._owner is not None:
            os.chown(password_file, *self._owner)
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", PG_USER,
                  "--auth=scram-sha-256", f"--pwfile={password_file}", "-E", "UTF8", "--no-sync")
        password_file.unlink()
        # fsync off: a throwaway cluster; the tests kill daemons, never the database.
        self._options = (f"-k {self.dir} -h 127.0.0.1 -p {self.port} -c fsync=off -c max_connections=200"
                         + extra_options)
        self.start_server()
        return self

    def start_server(self) -> None:
        self._run(str(self.bin_dir / "pg_ctl"), "start", "-D", str(self.data), "-w", "-l",
                  str(self.dir / "server.log"), "-o", self._options)

    def stop_server(self) -> None:
        """``pg_ctl stop -m fast``: the store is away until :meth:`start_server`."""
        self._run(str(self.bin_dir / "pg_ctl"), "stop", "-D", str(self.data), "-m", "fast", "-w")

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is dropped, the server is back when this returns."""
        self._run(str(self.bin_dir / "pg_ctl"), "restart", "-D", str(self.data), "-m", "fast", "-w", "-l",
                  str(self.dir / "server.log"))

    def url(self, database: str) -> str:
        return f"postgresql://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{self.port}/{database}"

    def fresh_database(self) -> str:
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            self._run(str(self.bin_dir / "pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate", "-w")
        shutil.rmtree(self.dir, ignore_errors=True)


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


S3_ACCESS_KEY = "hopline-test-key"
S3_SECRET_KEY = "s3-test-secret-41c9"  # a canary too
S3_REGION = "us-east-1"


class S3Server:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no request lines on the test output
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._buckets = itertools.count(1)
        self.endpoint = ""

    def start(self) -> S3Server:
        self._server.start()
        _, port = self._server.get_host_and_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        return self

    def env(self) -> dict[str, str]:
        """The standard variables a daemon is given, and nothing else (an http:// endpoint)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY, "AWS_REGION": S3_REGION}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_ACCESS_KEY,
                            aws_secret_access_key=S3_SECRET_KEY, region_name=S3_REGION)

    def fresh_bucket(self) -> str:
        name = f"hopline-test-{os.getpid()}-{next(self._buckets)}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        listed = self.client().list_objects_v2(Bucket=bucket)
        return sorted(item["Key"] for item in listed.get("Contents", []))

    def stop(self) -> None:
        self._server.stop()


class HangingProxy:
    """A loopback TCP proxy in front of a server (moto), switched by the test between forwarding and
    hanging. Hung, it is a server that accepts TCP and never answers: new connections are accepted
    and read, open ones go on being read, and nothing is forwarded either way. Switched back, the
    connections it held are cut (what a client gave up on) and new ones are forwarded."""

    def __init__(self, target_port: int) -> None:
        import asyncio
        import threading

        self.target_port = target_port
        self.port = 0
        self.hung = False
        self.client_bytes = 0  # read from clients, forwarded or not (a call that reached the store)
        self.loop = asyncio.new_event_loop()
        self._writers: set[Any] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        import asyncio

        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    async def _pipe(self, reader: Any, writer: Any, *, from_client: bool) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if from_client:
                    self.client_bytes += len(data)
                if self.hung:
                    continue  # read, never forwarded
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.close()

    async def _serve(self, client_reader: Any, client_writer: Any) -> None:
        import asyncio

        self._writers.add(client_writer)
        up_writer: Any = None
        try:
            if self.hung:  # accepted and read until the client gives up
                while data := await client_reader.read(65536):
                    self.client_bytes += len(data)
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._writers.add(up_writer)
            await asyncio.gather(self._pipe(client_reader, up_writer, from_client=True),
                                 self._pipe(up_reader, client_writer, from_client=False))
        except OSError:
            pass
        finally:
            for writer in (client_writer, up_writer):
                if writer is not None:
                    writer.close()
                    self._writers.discard(writer)

    def _call(self, fn: Callable[[], None]) -> None:
        import concurrent.futures

        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            fn()
            done.set_result(None)

        self.loop.call_soon_threadsafe(run)
        done.result(timeout=10)

    def hang(self) -> None:
        def set_hung() -> None:
            self.hung = True

        self._call(set_hung)

    def forward(self) -> None:
        """Forward again; every connection open meanwhile is cut first (its stream is half-read)."""
        def cut() -> None:
            self.hung = False
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()

        self._call(cut)

    def __enter__(self) -> HangingProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *_: object) -> None:
        import asyncio

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class ReplicatedPostgres:
    """A primary and one streaming replica (``pg_basebackup -R``), each a throwaway cluster on
    127.0.0.1, for the failover tests. The replica reaches the primary through a
    :class:`HangingProxy`, so a test can make it lag (WAL stops flowing, the sockets stay open);
    :meth:`fail_over` kills the primary (SIGKILL) and promotes the replica. ``synchronous`` makes
    every commit on the primary wait for the replica's flush (``synchronous_standby_names``,
    ``synchronous_commit``): then a failover loses nothing."""

    def __init__(self, bin_dir: Path, *, synchronous: bool) -> None:
        self.primary = PostgresCluster(bin_dir)
        self.replica_data = self.primary.dir / "replica"
        self.replica_port = free_port()
        self.synchronous = synchronous
        self.proxy: HangingProxy | None = None
        self.database = "hopline"

    def start(self) -> ReplicatedPostgres:
        self.primary.start(" -c wal_level=replica -c max_wal_senders=4 -c wal_keep_size=64MB")
        import psycopg

        with psycopg.connect(self.primary.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        self.proxy = HangingProxy(self.primary.port).__enter__()
        bin_dir, env = self.primary.bin_dir, {**os.environ, "PGPASSWORD": PG_PASSWORD}
        self.primary._run(str(bin_dir / "pg_basebackup"), "-D", str(self.replica_data), "-h", "127.0.0.1",
                          "-p", str(self.proxy.port), "-U", PG_USER, "-R", "-X", "stream", "--no-sync",
                          "--checkpoint=fast", env=env)
        self.primary._run(str(bin_dir / "pg_ctl"), "start", "-D", str(self.replica_data), "-w", "-l",
                          str(self.primary.dir / "replica.log"), "-o",
                          f"-k {self.primary.dir} -h 127.0.0.1 -p {self.replica_port} -c fsync=off "
                          "-c max_connections=200 -c hot_standby=on")
        deadline = time.monotonic() + 30
        while not self.streaming():
            if time.monotonic() > deadline:
                raise RuntimeError("the replica never streamed")
            time.sleep(0.1)
        if self.synchronous:  # set once the replica streams (before, every commit would wait for it)
            with psycopg.connect(self.primary.url("postgres"), autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                conn.execute("ALTER SYSTEM SET synchronous_commit = 'on'")
                conn.execute("SELECT pg_reload_conf()")
        return self

    def caught_up(self) -> bool:
        """The replica has replayed everything the primary wrote."""
        import psycopg

        with psycopg.connect(self.primary.url("postgres"), autocommit=True) as conn:
            row = conn.execute("SELECT bool_and(replay_lsn = pg_current_wal_lsn()) FROM pg_stat_replication "
                               "WHERE state = 'streaming'").fetchone()
        return bool(row and row[0])

    def streaming(self) -> bool:
        import psycopg

        with psycopg.connect(self.primary.url("postgres"), autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_replication "
                               "WHERE state = 'streaming'").fetchone()
        return bool(row and row[0] >= 1)

    @property
    def url(self) -> str:
        """Both servers, the writable one chosen: what an operator's failover-aware URL says."""
        return (f"postgresql://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{self.primary.port},"
                f"127.0.0.1:{self.replica_port}/{self.database}?target_session_attrs=read-write")

    def replica_url(self) -> str:
        return f"postgresql://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{self.replica_port}/{self.database}"

    def lag(self) -> None:
        """WAL stops reaching the replica (its connection stays open): it falls behind."""
        assert self.proxy is not None
        self.proxy.hang()

    def fail_over(self) -> None:
        """The primary dies (SIGKILL to its postmaster) and the replica is promoted."""
        import signal

        pid = int((self.primary.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        self.primary._run(str(self.primary.bin_dir / "pg_ctl"), "promote", "-D", str(self.replica_data), "-w")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            self.primary._run(str(self.primary.bin_dir / "pg_ctl"), "stop", "-D", str(self.replica_data),
                              "-m", "immediate", "-w")
        if self.proxy is not None:
            self.proxy.__exit__()
        self.primary.stop()
