"""A TCP proxy the test controls, between reclock and a server: the store's network, at will.

:class:`FaultProxy` listens on 127.0.0.1 in threads of the test process and relays every
connection to a target port. Three states, switched at any moment:

* **up**: bytes flow both ways;
* **refusing**: nothing listens on the port any more, so a new connection is refused by the kernel
  (``ECONNREFUSED``, exactly what a client sees of a stopped server), and every open connection is
  reset;
* **paused**: connections are accepted and kept open but no byte moves either way, as if the
  server hung; when the pause ends the bytes held flow again (a request a client gave up on may
  still reach the server late, as on a real network).

:meth:`refuse_at` arms a refusal for the first request whose first bytes match a predicate (say,
the first write of a remap binding's data file): that request never reaches the server, so a
test can fail exactly the write it means to, whatever the job's timing.

:meth:`hold` slows down the requests a predicate matches (a slow store for those only): they
reach the server, but ``seconds`` late.

The port stays the proxy's across a refusal: a socket stays bound to it (not listening, so the
kernel refuses), and listens again when the proxy comes back up.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

from tests.waiting import PATIENCE_S

__all__ = ["FaultProxy"]

_UP, _REFUSING, _PAUSED = "up", "refusing", "paused"


class FaultProxy:
    """Relays 127.0.0.1:``port`` to 127.0.0.1:``target``; :meth:`refuse`, :meth:`pause`, :meth:`up`."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.state = _UP
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self._conns: set[socket.socket] = set()
        self._armed: Callable[[bytes], bool] | None = None
        self._held: tuple[Callable[[bytes], bool], float] | None = None
        self.fired = threading.Event()
        #: Connections an outage met: open ones a refusal reset, new ones a pause held. A client
        #: that retried through an outage says nothing of it; this says the outage reached it.
        self.met = 0
        self._listener = _bound(0)
        self.port = self._listener.getsockname()[1]
        self._listener.listen(128)
        self._acceptor = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._acceptor.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def refuse(self) -> None:
        """Stop listening (new connections are refused) and reset every open one."""
        with self._lock:
            if self.state == _REFUSING:
                return
            self.state = _REFUSING
            old, self._listener = self._listener, None
            old.close()  # the acceptor's select sees it gone
            self._listener = _rebound(self.port)
            conns, self._conns = self._conns, set()
            self.met += len(conns) // 2  # a client's end and the server's per connection
            self._flowing.set()
        for conn in conns:
            _reset(conn)

    def pause(self) -> None:
        """Keep every connection open, accept new ones, and move no byte until :meth:`up`."""
        with self._lock:
            if self.state == _REFUSING:
                self._listen()
            self.state = _PAUSED
            self._flowing.clear()

    def up(self) -> None:
        """Relay again: listen if refusing, release what a pause held."""
        with self._lock:
            if self.state == _REFUSING:
                self._listen()
            self.state = _UP
            self._flowing.set()

    def refuse_at(self, request: Callable[[bytes], bool]) -> threading.Event:
        """Refuse from the first request whose first bytes ``request`` accepts, which is dropped;
        the event returned (:attr:`fired`) is set then."""
        self.fired.clear()
        self._armed = request
        return self.fired

    def hold(self, request: Callable[[bytes], bool] | None, seconds: float = 0.0) -> None:
        """Forward every request whose first bytes ``request`` accepts ``seconds`` late (``None``:
        none any more)."""
        self._held = None if request is None else (request, seconds)

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            self._flowing.set()
            if self._listener is not None:
                self._listener.close()
            conns, self._conns = self._conns, set()
        for conn in conns:
            _reset(conn)
        self._acceptor.join(timeout=PATIENCE_S)

    def _listen(self) -> None:
        assert self._listener is not None
        self._listener.listen(128)
        self._acceptor = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        listener = self._listener
        while not self._closed.is_set() and listener is self._listener:
            try:
                ready, _, _ = select.select([listener], [], [], 0.2)
                if not ready:
                    continue
                client, _ = listener.accept()
            except (OSError, ValueError):
                return  # closed by refuse() or close()
            if self.state == _PAUSED:
                self.met += 1
            threading.Thread(target=self._relay, args=(client,), name="proxy-relay", daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(("127.0.0.1", self.target), timeout=10)
        except OSError:
            _reset(client)
            return
        with self._lock:
            if self.state == _REFUSING or self._closed.is_set():
                _reset(client)
                server.close()
                return
            self._conns |= {client, server}
        ends = {client: server, server: client}
        try:
            while True:
                self._flowing.wait()
                ready, _, _ = select.select(list(ends), [], [], 0.2)
                if not self._flowing.is_set():
                    continue  # paused while waiting: hold the bytes
                for end in ready:
                    data = end.recv(1 << 16)
                    if not data:
                        return
                    armed = self._armed
                    if end is client and armed is not None and armed(data):
                        self._armed = None
                        self.refuse()  # resets this connection too: the request is lost
                        self.fired.set()
                        return
                    held = self._held
                    if end is client and held is not None and held[0](data):
                        time.sleep(held[1])
                    ends[end].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            with self._lock:
                self._conns -= {client, server}
            for end in (client, server):
                with contextlib.suppress(OSError):
                    end.close()


def _bound(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def _rebound(port: int) -> socket.socket:
    """The port bound again at once, not listening: the kernel refuses connections to it."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        try:
            return _bound(port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset, as a server that vanished does."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
