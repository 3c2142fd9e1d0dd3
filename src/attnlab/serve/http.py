"""JSON over HTTP on the standard library: what ``attnlab serve`` and the explorer's live mode
share.

Why the standard library and not an ASGI server (uvicorn + Starlette) or aiohttp: both servers
here answer a few JSON routes in front of one model thread, where the forward pass (tens of ms)
dwarfs any HTTP cost, so a framework's routing and validation would save little code; the one
hard part, a client that stalls while sending its request, is not solved by them either
(uvicorn has no deadline for a request's arrival: its keep-alive timer restarts at every byte,
encode/uvicorn#157 and #1685), and the explorer's server was already hardened here against
malformed lengths, deep JSON and foreign hosts. So one small core, no new dependency.

What it guards:

- **a request must arrive in time**: the request line and headers within ``head_timeout``
  seconds of the connection, the body within ``read_timeout`` more. The deadline is absolute:
  each read waits only for what is left of it, so a client that trickles a byte at a time is
  cut off like one that sends nothing (a read timeout that restarts at every byte would not).
  A stalled client holds only its own connection's thread, never the model's, and only until
  its deadline;
- **bounded connections**: at most ``max_connections`` at once; one more is answered 503 and
  closed at once, so stalled clients cannot pile up threads;
- **bounded bodies** (413 before reading), a ``Content-Length`` that is a byte count (400), JSON
  that parses and is not nested past Python's recursion limit (400);
- **loopback only**, when bound to a loopback address: the ``Host`` header must name this
  machine (DNS rebinding), and a request a browser marks as coming from another site is 403;
- every answer is ``Connection: close`` (one request per connection, HTTP/1.0 style): an idle
  keep-alive connection never holds a thread;
- a client that goes away mid-answer is dropped without a traceback.
"""

from __future__ import annotations

import io
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from attnlab.errors import UserError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
HEAD_TIMEOUT = 10.0  # seconds from the connection to the end of its headers
READ_TIMEOUT = 30.0  # seconds more for the body
WRITE_TIMEOUT = 30.0  # seconds an answer may wait on a client that does not read it
MAX_CONNECTIONS = 256  # connections served at once (a thread each); one more gets 503


class HttpError(Exception):
    """A request refused with ``status`` and a one-line ``message`` (sent as JSON)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def host_name(header: str) -> str:
    """The host of a ``Host`` header or an origin's authority, without port or brackets."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8000
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def allowed_host(header: str | None, bound: str) -> bool:
    """A loopback Host (or the address the server was told to listen on)."""
    if not header:
        return False
    name = host_name(header)
    return name in LOOPBACK or (bound not in ("", "0.0.0.0", "::") and name == bound.lower())


class DeadlineSocket(io.RawIOBase):
    """A socket's reading side that gives up at an absolute ``deadline`` (time.monotonic):
    every read waits only for the time left, then TimeoutError."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler that reads JSON bodies within limits and answers JSON.

    Subclasses set ``name`` (the log's prefix), ``bound`` (the address listened on) and
    ``max_body``, and implement ``do_GET`` / ``do_POST`` with :meth:`read_json` and
    :meth:`send_json`."""

    name = "serve"
    bound = "127.0.0.1"
    default_request_version = "HTTP/1.0"  # an answer always starts with a status line
    max_body = 1024 * 1024
    head_timeout = HEAD_TIMEOUT
    read_timeout = READ_TIMEOUT

    def setup(self) -> None:
        super().setup()
        self.deadline = DeadlineSocket(self.connection, time.monotonic() + self.head_timeout)
        self.rfile = io.BufferedReader(self.deadline)

    # -- checks

    def refused(self, page_only: bool = False) -> bool:
        """Answer 403 to a request from elsewhere than this machine while bound to loopback:
        a Host that does not name it, an Origin of another host; and always to a request a
        browser marks as cross-site. ``page_only`` (the explorer: its page is its one client)
        applies the Host and Origin rules wherever the server listens."""
        host = self.headers.get("Host")
        strict = page_only or self.bound in LOOPBACK
        why = None
        if strict and not allowed_host(host, self.bound):
            why = f"host {host!r} is not this machine; use the address 127.0.0.1"
        origin = self.headers.get("Origin")
        if why is None and origin is not None and strict:
            authority = origin.split("://", 1)[-1]
            if origin == "null" or host_name(authority) != host_name(host or ""):
                why = f"requests from {origin} are not accepted; use the page itself"
        site = self.headers.get("Sec-Fetch-Site", "same-origin")
        if why is None and site not in ("same-origin", "none"):
            why = "cross-site requests are not accepted; use the page itself"
        if why is not None:
            self.send_json(403, {"error": why})
        return why is not None

    def read_json(self) -> Any:
        """The request's JSON body, or HttpError (400 malformed, 408 late, 411 no length, 413
        too large, 501 a transfer coding other than chunked)."""
        coding = self.headers.get("Transfer-Encoding")
        if coding is not None:
            if self.headers.get("Content-Length") is not None:  # ambiguous: which one ends it?
                raise HttpError(400, "both Transfer-Encoding and Content-Length; send one")
            if coding.strip().lower() != "chunked":
                raise HttpError(501, f"Transfer-Encoding {coding[:20]!r}; send chunked or a "
                                "Content-Length")  # fmt: skip
            data = self.read_chunked()
        else:
            data = self.read_sized()
        try:
            return json.loads(data or b"{}")
        except RecursionError:
            raise HttpError(400, "the JSON is nested too deeply") from None
        except ValueError as err:  # JSONDecodeError, undecodable bytes
            raise HttpError(400, f"not JSON: {err}") from None

    def read_sized(self) -> bytes:
        """A body of ``Content-Length`` bytes."""
        text = self.headers.get("Content-Length")
        if text is None:
            raise HttpError(411, "no Content-Length; send the body with one (or chunked)")
        text = text.strip()
        # ASCII digits only ("²" is a digit to str.isdigit), and few: int() refuses 4300+
        if not (text.isascii() and text.isdigit() and len(text) <= 18):
            raise HttpError(400, f"Content-Length {text[:20]!r} is not a byte count")
        length = int(text)
        if length > self.max_body:
            raise HttpError(413, f"request over {self.max_body // 1024} KiB; send less")
        self.deadline.deadline = time.monotonic() + self.read_timeout
        try:
            data = self.rfile.read(length)
        except TimeoutError:  # fewer bytes than Content-Length, and the client waits
            raise HttpError(408, f"the body stopped short of its {length} bytes") from None
        if len(data) < length:  # the client closed its side early
            raise HttpError(400, f"the body stopped short of its {length} bytes")
        return data

    def read_chunked(self) -> bytes:
        """A ``Transfer-Encoding: chunked`` body (RFC 9112 section 7.1: hex size line, data,
        CRLF, ..., a zero size, trailer lines, an empty line), held to ``max_body`` and to the
        same deadline as a sized body."""
        self.deadline.deadline = time.monotonic() + self.read_timeout
        data = bytearray()
        try:
            while True:
                line = self.rfile.readline(1026)
                size = line.split(b";", 1)[0].strip()  # a chunk extension is ignored
                if not line.endswith(b"\n") or not re.fullmatch(rb"[0-9a-fA-F]{1,16}", size):
                    raise HttpError(400, "a chunked body with a malformed or missing size line")
                length = int(size, 16)
                if length == 0:
                    break
                if len(data) + length > self.max_body:
                    raise HttpError(413, f"request over {self.max_body // 1024} KiB; send less")
                chunk = self.rfile.read(length)
                if len(chunk) < length or self.rfile.readline(3) not in (b"\r\n", b"\n"):
                    raise HttpError(400, "a chunk of the body stopped short of its size")
                data += chunk
            for _ in range(64):  # trailer lines, up to the empty line that ends the body
                if self.rfile.readline(8194) in (b"\r\n", b"\n", b""):
                    break
            else:
                raise HttpError(400, "a chunked body with too many trailer lines")
        except TimeoutError:
            raise HttpError(408, "the chunked body did not arrive in time") from None
        return bytes(data)

    # -- answers

    def send_json(self, status: int, obj: Any, **headers: str) -> None:
        body = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self.send_body(status, body, "application/json; charset=utf-8", **headers)

    def send_body(self, status: int, body: bytes, kind: str, **headers: str) -> None:
        """The whole answer (a HEAD request gets its head only); a stopping server lets an
        answer begun before its deadline finish and starts none after it."""
        with self.server.answering():  # type: ignore[attr-defined]
            self.connection.settimeout(WRITE_TIMEOUT)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            for name, value in headers.items():
                self.send_header(name, value)
            self.close_connection = True  # one request per connection; a refused body may linger
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, 414 a long URL, 431 long
        headers, 505 a version, 501 an unknown method) in JSON, like every other answer."""
        self.close_connection = True
        self.send_json(code, {"error": message or self.responses.get(code, ("error",))[0]})

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        print(f"{self.name}: {format % args}", file=sys.stderr)


class Server(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` at once; a client that goes away
    is not an error worth a traceback."""

    daemon_threads = True
    max_connections = MAX_CONNECTIONS
    # connections the kernel holds until accepted: socketserver's 5 drops (resets) the rest
    # when a few dozen clients connect at once
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, address: tuple[str, int], handler: type[JsonHandler]) -> None:
        self.active = 0  # connections being served
        self.writing = 0  # answers being written
        self.closed = False  # a stopped server starts no answer (it would be cut mid-way)
        self.changed = threading.Condition()
        super().__init__(address, handler)

    @contextmanager
    def answering(self) -> Iterator[None]:
        """Around the writing of one answer; refused (the connection is dropped unanswered)
        once :meth:`close_answers` was called."""
        with self.changed:
            if self.closed:
                raise ConnectionAbortedError("the server stopped before this answer")
            self.writing += 1
        try:
            yield
        finally:
            with self.changed:
                self.writing -= 1
                self.changed.notify_all()

    def close_answers(self, timeout: float) -> bool:
        """Start no more answers and wait up to ``timeout`` seconds for those being written;
        whether they were all written."""
        with self.changed:
            self.closed = True
            return self.changed.wait_for(lambda: self.writing == 0, max(timeout, 0.0))

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.changed:
            full = self.active >= self.max_connections
            self.active += not full
        if full:
            busy = b'{"error": "too many connections at once; retry shortly"}'
            head = "HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            head += f"Content-Length: {len(busy)}\r\nConnection: close\r\n\r\n"
            try:
                request.settimeout(1.0)
                request.sendall(head.encode("ascii") + busy)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done()

    def _done(self) -> None:
        with self.changed:
            self.active -= 1
            self.changed.notify_all()

    def drain(self, until: float, give_up: Callable[[], bool] = lambda: False) -> bool:
        """Wait until ``until`` (time.monotonic) for the connections being served to finish
        (call it once the server accepts no more), or until ``give_up()``; whether they did.
        It wakes every 0.1 s: a signal handler running in this thread is never kept waiting."""
        with self.changed:
            while self.active and not give_up():
                left = until - time.monotonic()
                if left <= 0:
                    break
                self.changed.wait(min(left, 0.1))
            return self.active == 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):  # gone, or too slow
            return
        super().handle_error(request, client_address)


def check_port(port: int) -> None:
    """Refuse a port number no socket takes, before anything is loaded."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: give a port from 1 to 65535 (0 picks a free one)")


def listen(server: type[Server], handler: type[JsonHandler], host: str, port: int) -> Server:
    """``server`` bound to ``host:port`` (port 0: a free one), or one line saying why not."""
    try:
        return server((host, port), handler)
    except OSError as err:
        raise UserError(f"cannot listen on {host}:{port} ({err.strerror}); choose --port") from None
    except (OverflowError, UnicodeError, ValueError) as err:
        raise UserError(f"cannot listen on {host}:{port} ({err}); choose --host / --port") from None
