"""The floor relay: only the work any relay with the daemon's guarantees cannot skip, at its cheapest.

Not a product and not a baseline to beat: a measure of how much of the daemon's CPU is the work
itself. It answers ``GET /events`` on 127.0.0.1 like ``bench/naive_relay.py`` (same agent, same
handshake, ``: ready``, then ``event: done``), and for every frame it does what the daemon must:

* reads the pipe in large blocks (``os.read``, 1 MiB, like the raw pipe's reader);
* checks the frame is JSON (``orjson.loads``: the pipe hop refuses invalid frames);
* appends the frame's bytes to a file (the journal: D-5, nothing acknowledged is lost), keeping
  only its newest pages cached as the daemon's segment files do;
* sends it as an SSE event with its id over chunked HTTP (``socket.sendmsg``, scatter-gather: no
  join of the frame's bytes).

It does none of the rest: no budget, no projection, no ring or queue, no fsync, no second client,
no event loop; one thread, blocking system calls.

    python bench/floor_relay.py PORT AGENT_ARGV...
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile

import orjson

READ_BYTES = 1 << 20
CACHE_STEP_BYTES = 1 << 20
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
CHUNK_TAIL = b"\r\n"


def _send(sock: socket.socket, parts: list[bytes | memoryview]) -> None:
    """One HTTP chunk of ``parts``, sent without joining them."""
    size = sum(map(len, parts))
    pending: list[bytes | memoryview] = [b"%x\r\n" % size, *parts, CHUNK_TAIL]
    first = 0  # pending[first:] is still to send (an index: popping the head would be quadratic)
    while first < len(pending):
        sent = sock.sendmsg(pending[first:first + 512])
        while first < len(pending) and sent >= len(pending[first]):
            sent -= len(pending[first])
            first += 1
        if sent:
            pending[first] = memoryview(pending[first])[sent:]


def _request(child: subprocess.Popen[bytes], msg_id: int, method: str, params: dict) -> None:
    assert child.stdin is not None
    message = {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}
    child.stdin.write(orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE))
    child.stdin.flush()


def _answer(child: subprocess.Popen[bytes], msg_id: int) -> dict:
    assert child.stdout is not None
    while True:
        message = orjson.loads(child.stdout.readline())
        if message.get("id") == msg_id and "method" not in message:
            return message


def relay(conn: socket.socket, agent: list[str], journal_fd: int) -> None:
    request = b""
    while request.find(b"\r\n\r\n") == -1:  # one route: the request is not read further
        block = conn.recv(65536)
        if not block:
            return  # a probe of the port (the bench waits for it to listen), or a client gone
        request += block
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    child = subprocess.Popen(agent, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert child.stdout is not None
    _request(child, 1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    _answer(child, 1)
    _request(child, 2, "session/new", {"cwd": "/", "mcpServers": []})
    session_id = _answer(child, 2)["result"]["sessionId"]
    _send(conn, [b": ready\n\n"])
    _request(child, 3, "session/prompt",
             {"sessionId": session_id, "prompt": [{"type": "text", "text": "go"}]})
    fd, event_id, done = child.stdout.fileno(), 0, False
    stored, cached = 0, (0, 0)  # the journal's size; its page-cache window, as the daemon's segments
    pending: list[bytes | memoryview] = []  # the start of a frame whose newline has not come
    while not done:
        block = os.read(fd, READ_BYTES)
        if not block:
            break
        parts: list[bytes | memoryview] = []
        lines: list[bytes | memoryview] = []
        view, start = memoryview(block), 0
        while (end := block.find(b"\n", start)) != -1:
            begin, start = start, end + 1
            if pending:  # a frame across reads is joined once, as any JSON parser needs it whole
                frame = memoryview(b"".join((*pending, view[:start])))
                pending = []
            else:
                frame = view[begin:start]
            message = orjson.loads(frame[:-1])
            if message.get("method") != "session/update":
                done = done or message.get("id") == 3
                continue
            event_id += 1
            lines.append(frame)  # the frame and its newline
            parts += (b"id: %d\nevent: session_update\ndata: " % event_id, frame[:-1], b"\n\n")
        if start < len(block):
            pending.append(view[start:])
        for first in range(0, len(lines), 1024):  # IOV_MAX buffers a call
            stored += os.writev(journal_fd, lines[first:first + 1024])
        cached = _drop_written(journal_fd, stored, cached)
        if done:
            parts.append(b"event: done\ndata: {}\n\n")
        if parts:
            _send(conn, parts)
    _send(conn, [])  # the last chunk: the response ends
    assert child.stdin is not None
    child.stdin.close()
    child.wait(5)


def _drop_written(journal_fd: int, stored: int, cached: tuple[int, int]) -> tuple[int, int]:
    """The daemon's page-cache rule for its segment files (src/hopline/store/segments.py): each
    time the file grows by a step, its pages up to the step before are written out and dropped, so
    the next appends reuse them (fresh pages cost this VM ten times the CPU)."""
    start, mark = cached
    if stored - mark < CACHE_STEP_BYTES:
        return cached
    point = stored - stored % PAGE_BYTES
    os.posix_fadvise(journal_fd, start, point - start, os.POSIX_FADV_DONTNEED)
    return mark, point


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main() -> None:
    # The bench stops this relay with SIGTERM: exiting by SystemExit runs the cleanup of the
    # temporary directory below (its journal, up to a run's 256 MiB, was left behind on every run).
    signal.signal(signal.SIGTERM, _exit)
    port, agent = int(sys.argv[1]), sys.argv[2:]
    server = socket.create_server(("127.0.0.1", port))
    with tempfile.TemporaryDirectory() as workdir:
        while True:
            conn, _ = server.accept()
            with conn:
                journal = os.path.join(workdir, "journal")
                journal_fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    relay(conn, agent, journal_fd)
                finally:
                    os.close(journal_fd)


if __name__ == "__main__":
    main()
