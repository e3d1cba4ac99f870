"""Benchmark 4: the gateway refusing a 1 GiB upload (SPEC G-2) — memory and time to the 413.

The gateway app runs under uvicorn in a subprocess (``bench/gateway_server.py``) so its RSS is its
own; psutil samples it every few milliseconds during the upload. The client is a raw socket that
streams a chunked ``POST .../llm-turn`` of 1 GiB and stops as soon as the answer arrives or the
server closes. Bytes read by the server come from the gateway's own counter (the
``hopline_gateway_request_body_bytes`` histogram at ``/metrics``), next to the bytes the client
managed to push into the socket (which include what sits in kernel buffers). A declared
``Content-Length: 1 GiB`` is measured too (refused before any body byte is read).
"""

from __future__ import annotations

import contextlib
import re
import select
import socket
import threading
import time
from typing import Any

import httpx
import psutil

from bench.common import BENCH_DIR, HOST, PYTHON, BenchResult, Settings, Verdict, free_port, say, started
from hopline.budget import Budget, GiB, KiB, MiB

TOKEN = "bench-gateway-token"
UPLOAD_BYTES = 1 * GiB
CHUNK = 64 * KiB
TIMEOUT_S = 60.0
PATH = "/internal/sessions/bench/llm-turn"


class RssSampler:
    """Peak RSS of one process, sampled on a thread until stopped."""

    def __init__(self, pid: int, interval: float = 0.002) -> None:
        self.process = psutil.Process(pid)
        self.interval = interval
        self.baseline = self.process.memory_info().rss
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        with contextlib.suppress(psutil.Error):
            self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.baseline


def _head(chunked: bool, length: int) -> bytes:
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {length}"
    return (f"POST {PATH} HTTP/1.1\r\nhost: {HOST}\r\nauthorization: Bearer {TOKEN}\r\n"
            f"content-type: application/json\r\n{framing}\r\n\r\n").encode()


def upload(port: int, total: int, *, chunked: bool) -> dict[str, Any]:
    """Stream ``total`` body bytes; stop at the answer or a closed socket. Returns what happened."""
    payload = (b'{"messages":[{"role":"user","content":"' + b"x" * CHUNK)[:CHUNK]
    piece = (f"{CHUNK:x}\r\n".encode() + payload + b"\r\n") if chunked else payload
    sock = socket.create_connection((HOST, port), timeout=10)
    sock.sendall(_head(chunked, total))  # small: fits the socket buffer
    sock.setblocking(False)
    sent_body = 0  # body bytes (chunk framing included) written into the socket
    answer = b""
    started_at = time.perf_counter()
    answered_at: float | None = None
    deadline = started_at + TIMEOUT_S
    pending = memoryview(b"")
    pieces_left = total // CHUNK
    closed_by_server = False
    try:
        while time.perf_counter() < deadline:
            want_write = bool(pending) or pieces_left > 0
            readable, writable, _ = select.select([sock], [sock] if want_write else [], [], 1.0)
            if readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    closed_by_server = True
                    break
                if not data:
                    closed_by_server = True
                    break
                answer += data
                if answered_at is None:
                    answered_at = time.perf_counter()
                if _body_complete(answer):
                    break
                continue
            if writable:
                if not pending:
                    pending = memoryview(piece)
                    pieces_left -= 1
                try:
                    n = sock.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    closed_by_server = True
                    break
                pending = pending[n:]
                sent_body += n
    finally:
        sock.close()
    match = re.match(rb"HTTP/1\.1 (\d{3})", answer)
    status = int(match.group(1)) if match else None
    elapsed = (answered_at or time.perf_counter()) - started_at
    body = answer.split(b"\r\n\r\n", 1)[-1][:400].decode("utf-8", "replace")
    return {"status": status, "clientSentBodyBytes": sent_body, "secondsToAnswer": elapsed,
            "closedByServer": closed_by_server, "answer": body}


def _body_complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    match = re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE)
    return match is not None and len(body) >= int(match.group(1))


def server_read_bytes(port: int) -> tuple[float | None, float | None]:
    """(sum, count) of the gateway's request-body-bytes histogram."""
    text = httpx.get(f"http://{HOST}:{port}/metrics", headers={"authorization": f"Bearer {TOKEN}"},
                     timeout=10).text
    total = count = None
    for line in text.splitlines():
        if line.startswith("hopline_gateway_request_body_bytes_sum"):
            total = float(line.split()[-1])
        elif line.startswith("hopline_gateway_request_body_bytes_count"):
            count = float(line.split()[-1])
    return total, count


def run(settings: Settings) -> BenchResult:
    result = BenchResult("gateway")
    limit = Budget.defaults().api_json_body_limit
    upload_bytes = settings.pick(UPLOAD_BYTES, UPLOAD_BYTES)  # the refusal is quick either way
    port = free_port()
    log = settings.workdir / "gateway.stderr"
    cases: dict[str, Any] = {}
    with started([PYTHON, str(BENCH_DIR / "gateway_server.py"), str(port), TOKEN], port=port,
                 stderr_path=log) as proc:
        httpx.get(f"http://{HOST}:{port}/health", timeout=10).raise_for_status()
        for name, chunked in (("chunked", True), ("contentLength", False)):
            before_sum, _ = server_read_bytes(port)
            time.sleep(0.2)
            with RssSampler(proc.pid) as rss:
                outcome = upload(port, upload_bytes, chunked=chunked)
                time.sleep(0.1)
            after_sum, _ = server_read_bytes(port)
            outcome["serverReadBodyBytes"] = (after_sum or 0) - (before_sum or 0)
            outcome["rssBaselineBytes"] = rss.baseline
            outcome["rssPeakGrowthBytes"] = rss.growth
            cases[name] = outcome
            say(f"  {name:>13}: HTTP {outcome['status']} after {outcome['secondsToAnswer'] * 1e3:.0f} ms; "
                f"server read {outcome['serverReadBodyBytes'] / MiB:.2f} MiB, client pushed "
                f"{outcome['clientSentBodyBytes'] / MiB:.2f} MiB of {upload_bytes / MiB:.0f} MiB; "
                f"RSS growth {rss.growth / MiB:.2f} MiB (baseline {rss.baseline / MiB:.0f} MiB)")
    result.figures = {"limitBytes": limit, "uploadBytes": upload_bytes, **cases}
    chunked = cases["chunked"]
    twice = 2 * limit
    result.verdicts.append(Verdict("chunked 1 GiB answered 413 (1 = yes)", float(chunked["status"] == 413),
                                   1.0, True, unit="", note=f"HTTP {chunked['status']}"))
    result.verdicts.append(Verdict("chunked 1 GiB: bytes read by the server / (2 x limit)",
                                   chunked["serverReadBodyBytes"] / twice, 1.0, False,
                                   note=f"{chunked['serverReadBodyBytes'] / MiB:.2f} MiB read, limit "
                                        f"{limit / MiB:.0f} MiB"))
    result.verdicts.append(Verdict("chunked 1 GiB: peak RSS growth / (2 x limit)",
                                   chunked["rssPeakGrowthBytes"] / twice, 1.0, False,
                                   note=f"{chunked['rssPeakGrowthBytes'] / MiB:.2f} MiB"))
    result.figures["secondsTo413Chunked"] = chunked["secondsToAnswer"]
    result.notes.append("client-pushed bytes include what the kernel buffered on both ends of the "
                        "loopback socket; the server-read figure is the gateway's own counter")
    return result
