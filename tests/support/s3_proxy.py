"""An HTTP/1.1 reverse proxy in front of a real S3 server that injects faults.

Chaos tests put it between S3 clients (boto3, delta-rs/object_store, pyarrow's
S3FileSystem) and SeaweedFS to make the S3 path misbehave while a driver is killed.
It binds 127.0.0.1 only and runs its own asyncio loop in a background thread, so a
pytest process can start it and driver subprocesses reach it through
``AWS_ENDPOINT_URL=http://127.0.0.1:<port>``.

Requests and responses are forwarded byte for byte: the Host header is untouched, so
SigV4 signatures still verify upstream. Client connections are kept alive; every
request gets a fresh upstream connection. A client's ``Expect: 100-continue`` is
answered by the proxy itself before it reads the body (the header is still forwarded,
since a client may have signed it, and the upstream's own ``100`` is dropped).

Run the S3 clients under test in another process than the proxy: delta-rs holds the
GIL while it waits for some S3 answers (`DeltaTable.history`), so a client in the
proxy's own process can deadlock it.

Faults, decided per request by a seeded ``random.Random`` (reproducible for the same
sequence of requests):

- ``error_503``: answer ``503 SlowDown`` without forwarding (nothing is applied);
- ``error_500``: answer ``500 InternalError`` without forwarding;
- ``latency``: sleep ``latency_ms`` (a number or a ``(low, high)`` range) first;
- ``reset_after_apply``: forward, read the whole response (the write landed), then
  reset the client connection without answering: the "lost response".

Example:
    >>> plan = FaultPlan([Fault("error_503", 0.3), Fault("reset_after_apply", 0.2, {"PUT"})])
    >>> with S3FaultProxy(f"127.0.0.1:{seaweed.port}", plan=plan) as proxy:  # doctest: +SKIP
    ...     env = {**seaweed.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url}
    ...     run_driver(env)
    ...     proxy.set_faults(FaultPlan())  # or proxy.clear_faults()
    ...     assert proxy.stats()["error_503"] > 0
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import socket
import struct
import threading
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Self
from xml.sax.saxutils import escape

HOST = "127.0.0.1"
_PIECE = 64 * 1024
_HEAD_LIMIT = 256 * 1024
_METHODS = frozenset({"GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH"})


class FaultKind(StrEnum):
    """What a fault does to a request."""

    ERROR_503 = "error_503"
    ERROR_500 = "error_500"
    LATENCY = "latency"
    RESET_AFTER_APPLY = "reset_after_apply"


# Status, reason phrase, S3 error code and message of the faults answered by the proxy.
_ERRORS: dict[FaultKind, tuple[int, str, str, str]] = {
    FaultKind.ERROR_503: (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    FaultKind.ERROR_500: (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
}


@dataclass(frozen=True)
class Fault:
    """One fault: what it does, how often, and to which requests.

    Attributes:
        kind: A ``FaultKind`` (or its string value, e.g. ``"error_503"``).
        probability: Chance in 0..1 that a matching request gets the fault.
        methods: HTTP methods it applies to (any case); ``None`` means all.
        path: Regex searched in the request target (path and query string, e.g.
            ``/bucket/t/_delta_log/`` or ``uploadId=``); ``None`` means all.
        latency_ms: For ``latency`` only: milliseconds, or a ``(low, high)`` range
            drawn uniformly per request.
    """

    kind: FaultKind | str
    probability: float
    methods: Iterable[str] | None = None
    path: str | None = None
    latency_ms: float | tuple[float, float] | None = None
    _methods: frozenset[str] | None = field(init=False, repr=False, compare=False)
    _pattern: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise the fields once, here
        set_(self, "kind", _check_kind(self.kind))
        _check_probability(self.probability)
        set_(self, "_methods", _check_methods(self.methods))
        set_(self, "methods", self._methods)
        set_(self, "_pattern", _check_path(self.path))
        set_(self, "latency_ms", _check_latency(self.kind, self.latency_ms))

    def matches(self, method: str, target: str) -> bool:
        """Whether this fault applies to a request (before its probability is drawn)."""
        if self._methods is not None and method not in self._methods:
            return False
        return self._pattern is None or self._pattern.search(target) is not None


@dataclass(frozen=True)
class FaultPlan:
    """The faults in force, and the seed of the random draws deciding them.

    Every matching fault draws once per request, in order. Latencies add up; of the
    other kinds the first that fires wins (an error answer, or a reset).

    Attributes:
        faults: The faults; empty means a transparent proxy.
        seed: Seed of the ``random.Random`` (reset whenever a plan is installed).
    """

    faults: Iterable[Fault] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        faults = tuple(self.faults)
        for fault in faults:
            if not isinstance(fault, Fault):
                raise TypeError(f"FaultPlan.faults must hold Fault objects, got {fault!r}")
        object.__setattr__(self, "faults", faults)


def _check_kind(kind: FaultKind | str) -> FaultKind:
    try:
        return FaultKind(kind)
    except ValueError:
        known = ", ".join(k.value for k in FaultKind)
        raise ValueError(f"unknown fault kind {kind!r}; use one of: {known}") from None


def _check_probability(probability: float) -> None:
    if isinstance(probability, bool) or not isinstance(probability, int | float):
        raise ValueError(f"fault probability {probability!r} is not a number; give 0..1")
    if not 0.0 <= probability <= 1.0:
        raise ValueError(
            f"fault probability {probability!r} is outside 0..1; give e.g. 0.3 for 30%"
        )


def _check_methods(methods: Iterable[str] | None) -> frozenset[str] | None:
    if methods is None:
        return None
    if isinstance(methods, str):  # "PUT" would otherwise become {"P", "U", "T"}
        methods = [methods]
    upper = frozenset(str(m).upper() for m in methods)
    unknown = sorted(upper - _METHODS)
    if unknown:
        raise ValueError(
            f"unknown HTTP method(s) {unknown} in fault methods; use some of {sorted(_METHODS)}"
        )
    if not upper:
        raise ValueError("fault methods is empty; give None to match every method")
    return upper


def _check_path(path: str | None) -> re.Pattern[str] | None:
    if path is None:
        return None
    try:
        return re.compile(path)
    except re.error as exc:
        raise ValueError(
            f"fault path regex {path!r} does not compile ({exc}); escape literal text "
            "with re.escape()"
        ) from None


def _check_latency(
    kind: FaultKind | str, latency_ms: float | tuple[float, float] | None
) -> float | tuple[float, float] | None:
    if kind != FaultKind.LATENCY:
        if latency_ms is not None:
            raise ValueError(f"latency_ms={latency_ms!r} is only for kind 'latency', not {kind}")
        return None
    if latency_ms is None:
        raise ValueError("a 'latency' fault needs latency_ms (e.g. 200 or (100, 500))")
    low, high = latency_ms if isinstance(latency_ms, tuple) else (latency_ms, latency_ms)
    if not 0 <= low <= high:
        raise ValueError(
            f"latency_ms={latency_ms!r} is invalid; give ms >= 0, or (low, high) with low <= high"
        )
    return latency_ms


@dataclass
class _Decision:
    latency_s: float = 0.0
    action: FaultKind | None = None


# --------------------------------------------------------------------------
# HTTP/1.1 framing
# --------------------------------------------------------------------------


class _BadMessage(Exception):
    """A message the proxy cannot frame; the connection is closed."""


@dataclass
class _Head:
    raw: bytes
    start: list[str]
    headers: dict[str, list[str]]

    def values(self, name: str) -> list[str]:
        """Comma-separated tokens of a header, lower-cased, across repeated lines."""
        joined = ",".join(self.headers.get(name, []))
        return [t.strip().lower() for t in joined.split(",") if t.strip()]

    def content_length(self) -> int | None:
        values = set(self.headers.get("content-length", []))
        if not values:
            return None
        if len(values) > 1 or not next(iter(values)).isdigit():
            raise _BadMessage(f"bad Content-Length {sorted(values)}")
        return int(next(iter(values)))

    def is_chunked(self) -> bool:
        codings = self.values("transfer-encoding")
        if codings and codings[-1] != "chunked":
            raise _BadMessage(f"unsupported Transfer-Encoding {codings}")
        return bool(codings)


async def _read_head(reader: asyncio.StreamReader) -> _Head | None:
    """Read a request or response head; ``None`` on a clean end of stream."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise _BadMessage("connection closed inside a message head") from None
        return None
    except asyncio.LimitOverrunError:
        raise _BadMessage("message head too large") from None
    lines = raw[:-4].decode("latin-1").split("\r\n")
    start = lines[0].split(" ", 2)
    if len(start) < 2:
        raise _BadMessage(f"bad start line {lines[0]!r}")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadMessage(f"bad header line {line!r}")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return _Head(raw, start, headers)


async def _exactly(reader: asyncio.StreamReader, size: int) -> AsyncIterator[bytes]:
    while size > 0:
        piece = await reader.read(min(size, _PIECE))
        if not piece:
            raise asyncio.IncompleteReadError(b"", size)
        size -= len(piece)
        yield piece


async def _chunked(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """Yield a chunked body raw (size lines with extensions, data, trailers)."""
    while True:
        line = await reader.readuntil(b"\r\n")
        yield line
        try:
            # aws-chunked puts ";chunk-signature=..." after the size.
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _BadMessage(f"bad chunk size line {line[:80]!r}") from None
        if size == 0:
            break
        async for piece in _exactly(reader, size + 2):
            yield piece
    while True:
        line = await reader.readuntil(b"\r\n")
        yield line
        if line == b"\r\n":
            return


async def _until_eof(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while piece := await reader.read(_PIECE):
        yield piece


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # makes this an async generator


def _status(response: _Head) -> int:
    code = response.start[1]
    return int(code) if code.isdigit() else 0


def _response_has_no_body(response: _Head, method: str) -> bool:
    status = _status(response)
    return method == "HEAD" or status in (204, 304) or 100 <= status < 200


def _body(
    reader: asyncio.StreamReader, head: _Head, *, response_to: str | None = None
) -> AsyncIterator[bytes]:
    """The raw body after ``head``; ``response_to`` is the request method for responses."""
    if response_to is not None and _response_has_no_body(head, response_to):
        return _nothing()
    if head.is_chunked():
        return _chunked(reader)
    length = head.content_length()
    if length is not None:
        return _exactly(reader, length)
    # Unframed requests have no body; unframed responses run to the end of stream.
    return _nothing() if response_to is None else _until_eof(reader)


def _client_keeps_alive(request: _Head) -> bool:
    tokens = request.values("connection")
    if request.start[2] == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


def _response_keeps_alive(response: _Head, method: str) -> bool:
    """Whether the client may send another request after this response."""
    tokens = response.values("connection")
    if "close" in tokens or (response.start[0] == "HTTP/1.0" and "keep-alive" not in tokens):
        return False
    framed = "content-length" in response.headers or "transfer-encoding" in response.headers
    return framed or _response_has_no_body(response, method)


def _error_response(
    status: int, reason: str, code: str, message: str, request: _Head, keep_alive: bool
) -> bytes:
    """An S3-style XML error answer (no body for HEAD, as S3 does)."""
    request_id = uuid.uuid4().hex[:16].upper()
    resource = escape(request.start[1].split("?", 1)[0])
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>"
        f"<Resource>{resource}</Resource><RequestId>{request_id}</RequestId></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"x-amz-request-id: {request_id}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    ).encode()
    return head if request.start[0] == "HEAD" else head + body


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort a connection with a TCP RST (SO_LINGER 0) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _parse_upstream(upstream: str) -> tuple[str, int]:
    text = upstream.removeprefix("http://").rstrip("/")
    host, sep, port = text.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536 and "/" not in text):
        raise ValueError(
            f"upstream {upstream!r} is not host:port; give e.g. '127.0.0.1:8333' "
            "(or 'http://127.0.0.1:8333'; https is not supported)"
        )
    return host, int(port)


# --------------------------------------------------------------------------
# The proxy
# --------------------------------------------------------------------------

STAT_KEYS = (
    "connections",
    "requests",
    "forwarded",
    *(kind.value for kind in FaultKind),
    "upstream_errors",
)
"""Keys of ``S3FaultProxy.stats()``."""


class S3FaultProxy:
    """A fault-injecting reverse proxy for S3 on 127.0.0.1, served from a background thread.

    Args:
        upstream: The real S3 server, ``host:port`` (or ``http://host:port``).
        port: Port to listen on; 0 picks a free one (read it from ``port``).
        plan: Faults in force from the start; none by default.
        upstream_timeout: Seconds to wait for the upstream to connect, answer, or
            send the next piece of a body.
    """

    def __init__(
        self,
        upstream: str,
        *,
        port: int = 0,
        plan: FaultPlan | None = None,
        upstream_timeout: float = 60.0,
    ) -> None:
        if not 0 <= port < 65536:
            raise ValueError(f"port {port!r} is outside 0..65535; give 0 for a free port")
        self._upstream = _parse_upstream(upstream)
        self._requested_port = port
        self._timeout = upstream_timeout
        self._lock = threading.Lock()
        self._plan = FaultPlan()
        self._rng = random.Random(0)
        self._stats = dict.fromkeys(STAT_KEYS, 0)
        self.set_faults(plan or FaultPlan())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        self._port: int | None = None

    # -- lifecycle ----------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the proxy listens on (after ``start()``)."""
        if self._port is None:
            raise RuntimeError("the S3 proxy is not started; call start() first")
        return self._port

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT``, for ``AWS_ENDPOINT_URL``."""
        return f"http://{HOST}:{self.port}"

    def start(self) -> Self:
        """Bind and start serving in a background thread; returns ``self``."""
        if self._thread is not None:
            raise RuntimeError("the S3 proxy is already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, args=(ready, failure), name="s3-fault-proxy", daemon=True
        )
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise RuntimeError(
                f"cannot listen on {HOST}:{self._requested_port}: {failure[0]}; "
                "give port=0 to pick a free port"
            ) from failure[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and drop open connections (idempotent)."""
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(
                    self._serve_client, HOST, self._requested_port, limit=_HEAD_LIMIT
                )
            )
        except OSError as exc:
            failure.append(exc)
            loop.close()
            ready.set()
            return
        self._port = int(self._server.sockets[0].getsockname()[1])
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._shutdown())
            loop.close()

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        # Python 3.11's Server.close() leaves accepted connections open.
        for client in list(self._clients):
            client.transport.abort()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- faults and stats (called from any thread) --------------------------

    def set_faults(self, plan: FaultPlan) -> None:
        """Install a fault plan for the next requests; re-seeds the random draws."""
        if not isinstance(plan, FaultPlan):
            raise TypeError(f"set_faults() takes a FaultPlan, got {plan!r}")
        with self._lock:
            self._plan = plan
            self._rng = random.Random(plan.seed)

    def clear_faults(self) -> None:
        """Forward everything untouched from now on."""
        self.set_faults(FaultPlan())

    @property
    def faults(self) -> FaultPlan:
        """The plan in force."""
        with self._lock:
            return self._plan

    def stats(self) -> dict[str, int]:
        """Counters since start (or ``reset_stats()``), keyed as in ``STAT_KEYS``.

        ``connections`` and ``requests`` from clients, requests ``forwarded`` upstream,
        faults applied by kind (``error_503``, ``error_500``, ``latency``,
        ``reset_after_apply``), and ``upstream_errors`` (answered 502).
        """
        with self._lock:
            return dict(self._stats)

    def reset_stats(self) -> None:
        """Set every counter back to 0."""
        with self._lock:
            self._stats = dict.fromkeys(STAT_KEYS, 0)

    def _count(self, key: str) -> None:
        with self._lock:
            self._stats[key] += 1

    def _decide(self, method: str, target: str) -> _Decision:
        decision = _Decision()
        with self._lock:
            for fault in self._plan.faults:
                if not fault.matches(method, target) or self._rng.random() >= fault.probability:
                    continue
                if fault.kind == FaultKind.LATENCY:
                    decision.latency_s += self._draw_ms(fault.latency_ms) / 1000
                elif decision.action is None:
                    decision.action = FaultKind(fault.kind)
        return decision

    def _draw_ms(self, latency_ms: float | tuple[float, float] | None) -> float:
        if isinstance(latency_ms, tuple):
            return self._rng.uniform(*latency_ms)
        return float(latency_ms or 0)

    # -- serving (event-loop thread) ----------------------------------------

    async def _serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._clients.add(writer)
        self._count("connections")
        try:
            while await self._serve_request(reader, writer):
                pass
        except (
            _BadMessage,
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
        ):
            pass  # unframeable or broken (either side): the client sees its connection closed
        except asyncio.CancelledError:
            pass  # stop(): end quietly, else asyncio logs the cancelled connection task
        finally:
            self._clients.discard(writer)
            writer.close()

    async def _serve_request(
        self, reader: asyncio.StreamReader, client: asyncio.StreamWriter
    ) -> bool:
        """Serve one request; return whether the client connection stays open."""
        request = await _read_head(reader)
        if request is None:
            return False
        if len(request.start) != 3:
            raise _BadMessage(f"bad request line {request.start!r}")
        self._count("requests")
        method, target = request.start[0], request.start[1]
        decision = self._decide(method, target)
        if "100-continue" in request.values("expect"):
            # Answered here, so the body arrives before we decide what to do with it.
            client.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = b"".join([piece async for piece in _body(reader, request)])
        keep_alive = _client_keeps_alive(request)
        if decision.latency_s > 0:
            self._count(FaultKind.LATENCY.value)
            await asyncio.sleep(decision.latency_s)
        action = decision.action
        if action is not None and action in _ERRORS:
            self._count(action.value)
            client.write(_error_response(*_ERRORS[action], request, keep_alive))
            await client.drain()
            return keep_alive
        reset = action == FaultKind.RESET_AFTER_APPLY
        return await self._forward(request, body, client, keep_alive, reset)

    async def _forward(
        self,
        request: _Head,
        body: bytes,
        client: asyncio.StreamWriter,
        keep_alive: bool,
        reset: bool,
    ) -> bool:
        upstream: asyncio.StreamWriter | None = None
        try:
            try:
                upstream_reader, upstream = await self._exchange(request, body)
                response = await self._response_head(upstream_reader)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, _BadMessage) as exc:
                self._count("upstream_errors")
                gateway = ("Bad Gateway", "BadGateway", f"S3 proxy upstream failed: {exc!r}")
                client.write(_error_response(502, *gateway, request, keep_alive=False))
                await client.drain()
                return False
            body_pieces = self._timed(
                _body(upstream_reader, response, response_to=request.start[0])
            )
            if reset:
                async for _ in body_pieces:
                    pass  # the upstream applied the request; its answer is lost
                self._count(FaultKind.RESET_AFTER_APPLY.value)
                _reset(client)
                return False
            client.write(response.raw)
            async for piece in body_pieces:
                client.write(piece)
                await client.drain()
            await client.drain()
            return keep_alive and _response_keeps_alive(response, request.start[0])
        finally:
            if upstream is not None:
                upstream.close()

    async def _exchange(
        self, request: _Head, body: bytes
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Open a fresh upstream connection and send the request byte for byte."""
        async with asyncio.timeout(self._timeout):
            reader, writer = await asyncio.open_connection(*self._upstream, limit=_HEAD_LIMIT)
        try:
            writer.write(request.raw)
            writer.write(body)
            async with asyncio.timeout(self._timeout):
                await writer.drain()
        except BaseException:
            writer.close()
            raise
        self._count("forwarded")
        return reader, writer

    async def _response_head(self, reader: asyncio.StreamReader) -> _Head:
        """The final response head; interim 1xx answers (e.g. 100 Continue) are dropped."""
        while True:
            async with asyncio.timeout(self._timeout):
                head = await _read_head(reader)
            if head is None:
                raise _BadMessage("upstream closed the connection without answering")
            if not 100 <= _status(head) < 200 or _status(head) == 101:
                return head

    async def _timed(self, pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        while True:
            try:
                async with asyncio.timeout(self._timeout):
                    piece = await anext(pieces)
            except StopAsyncIteration:
                return
            yield piece
