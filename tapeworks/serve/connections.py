"""How `tapeworks serve` holds connections: timeouts for idle and stalled clients, drains.

uvicorn times a keep-alive connection out only after a response; a client
that connects and sends nothing, or stops halfway through its headers, held
a connection (and a file descriptor) forever. `TimedHttpProtocol` arms
uvicorn's keep-alive timer when a connection opens and a header timer while
a request's headers are incomplete. The body has its own deadline in the
app (`Settings.body_timeout`: 408).

It also bounds a request's headers, as servers do (nginx: 4 x 8 KiB by
default, Apache: 100 fields): httptools, unlike h11, has no limit of its own,
and 20,000 headers (2 MB) or one header of 4 MB were taken and answered 200.
Over `max_header_bytes` (the request line and every field, 64 KiB by default)
or `max_header_fields` (100) the answer is 431 Request Header Fields Too Large,
and the connection closes. The parser hands over a field only once it is
whole, so the bytes received while headers are incomplete are bounded too
(the limit plus one read), so one endless field cannot grow in memory.

On SIGTERM (or SIGINT) `DrainingServer` drains, as an orchestrator expects
of a server it stops: it keeps accepting for `SETTLE_SECONDS` (connections
the kernel already queued, and request bytes already sent, are taken in),
then stops accepting, answers every request it has received, closes idle
connections, and returns within the grace period; the process then exits
with status 0 (uvicorn would re-raise the signal: status -15).
"""

import asyncio
import contextlib
import json
import signal
import threading

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

SETTLE_SECONDS = 0.25
MAX_HEADER_BYTES = 64 << 10
MAX_HEADER_FIELDS = 100
# asyncio reads at most this much at a time: bytes received while headers are
# incomplete beyond the limit plus one read cannot all be body.
_ONE_READ = 256 << 10


class HeadersTooLarge(Exception):
    """Raised in a parser callback to stop parsing a request whose headers are too large."""


class TimedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol: timeouts before the first byte and within headers,
    and a bound on the headers' size."""

    header_timeout = 10.0   # seconds from a request's first byte to its last header
    max_header_bytes = MAX_HEADER_BYTES
    max_header_fields = MAX_HEADER_FIELDS

    def connection_made(self, transport):
        super().connection_made(transport)
        self.header_timer = None
        self.headers_pending = True   # before the current request's last header
        self.received_in_headers = 0  # bytes received since then (a bound on memory)
        self.header_bytes = self.header_fields = 0
        self.refusal = None           # why the request's headers were refused
        # A connection that never sends a byte is idle: uvicorn's keep-alive timeout.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                            self.timeout_keep_alive_handler)

    def data_received(self, data):
        if self.headers_pending:
            self.received_in_headers += len(data)
            if self.received_in_headers > self.max_header_bytes + _ONE_READ:
                self.refuse_headers(f"more than {self.max_header_bytes:,} bytes of headers "
                                    "received")
                return
        super().data_received(data)
        if self.transport.is_closing():
            return
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and self.header_timer is None:
            self.header_timer = self.loop.call_later(self.header_timeout,
                                                     self.timeout_keep_alive_handler)

    def on_message_begin(self):
        self.headers_pending = True
        self.header_bytes = self.header_fields = 0
        super().on_message_begin()

    def on_url(self, url):
        self._count_header(len(url))
        super().on_url(url)

    def on_header(self, name, value):
        self.header_fields += 1
        self._count_header(len(name) + len(value) + 4)   # "name: value\r\n"
        super().on_header(name, value)

    def _count_header(self, size):
        self.header_bytes += size
        if self.header_bytes > self.max_header_bytes:
            self.refusal = (f"the request line and headers exceed {self.max_header_bytes:,} "
                            "bytes")
        elif self.header_fields > self.max_header_fields:
            self.refusal = f"more than {self.max_header_fields} header fields"
        if self.refusal:
            # httptools turns it into an HttpParserError; uvicorn then answers
            # through `send_400_response`, which sends the 431 instead.
            raise HeadersTooLarge(self.refusal)

    def send_400_response(self, msg):
        if self.refusal is None:
            super().send_400_response(msg)
        else:
            self.refuse_headers(self.refusal)

    def refuse_headers(self, why):
        """Answers 431 and closes the connection."""
        body = json.dumps({"error": f"Request header fields too large: {why}. Expected at "
                                    f"most {self.max_header_fields} fields and "
                                    f"{self.max_header_bytes:,} bytes. Fix: send fewer or "
                                    "smaller headers (or raise --max-header-kb)."}).encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                             b"content-type: application/json\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\n"
                             b"connection: close\r\n\r\n" + body)
        self.transport.close()

    def on_headers_complete(self):
        self.headers_pending = False
        self.received_in_headers = 0
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None
        super().on_headers_complete()

    def on_message_complete(self):
        super().on_message_complete()
        self.headers_pending = True   # the next request on this connection

    def connection_lost(self, exc):
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None
        super().connection_lost(exc)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which drains on SIGTERM/SIGINT and lets the process exit 0."""

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets=None):
        # Connections queued in the kernel before the signal, and requests
        # sent on them, are taken in before the listening sockets close
        # (without this, they were reset): at least SETTLE_SECONDS, and until
        # no connection or request has started for three looks in a row.
        loop = asyncio.get_running_loop()
        started, quiet, seen = loop.time(), 0, None
        limit = started + max(SETTLE_SECONDS, self.config.timeout_graceful_shutdown or 0) / 2
        while loop.time() < limit and (quiet < 3 or loop.time() - started < SETTLE_SECONDS):
            await asyncio.sleep(0.05)
            now = (len(self.server_state.connections), self.server_state.total_requests)
            quiet = quiet + 1 if now == seen else 0
            seen = now
        await super().shutdown(sockets=sockets)
