"""How `tapeworks serve` holds connections: timeouts for idle and stalled clients, drains.

uvicorn times a keep-alive connection out only after a response; a client
that connects and sends nothing, or stops halfway through its headers, held
a connection (and a file descriptor) forever. `TimedHttpProtocol` arms
uvicorn's keep-alive timer when a connection opens and a header timer while
a request's headers are incomplete. The body has its own deadline in the
app (`Settings.body_timeout`: 408).

On SIGTERM (or SIGINT) `DrainingServer` drains, as an orchestrator expects
of a server it stops: it keeps accepting for `SETTLE_SECONDS` (connections
the kernel already queued, and request bytes already sent, are taken in),
then stops accepting, answers every request it has received, closes idle
connections, and returns within the grace period; the process then exits
with status 0 (uvicorn would re-raise the signal: status -15).
"""

import asyncio
import contextlib
import signal
import threading

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

SETTLE_SECONDS = 0.25


class TimedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a timeout before the first byte and within headers."""

    header_timeout = 10.0   # seconds from a request's first byte to its last header

    def connection_made(self, transport):
        super().connection_made(transport)
        self.header_timer = None
        # A connection that never sends a byte is idle: uvicorn's keep-alive timeout.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                            self.timeout_keep_alive_handler)

    def data_received(self, data):
        super().data_received(data)
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and self.header_timer is None and not self.transport.is_closing():
            self.header_timer = self.loop.call_later(self.header_timeout,
                                                     self.timeout_keep_alive_handler)

    def on_headers_complete(self):
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None
        super().on_headers_complete()

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
