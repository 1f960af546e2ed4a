"""uvicorn on a socket we bind ourselves: port 0 works, and the `ready` line names the address actually bound."""

from __future__ import annotations

import socket
import sys
import threading
import time

import uvicorn

# The engine thread runs Python between its kernel calls and holds the GIL meanwhile; with Python's default 5 ms
# switch interval the event loop waited up to that long for every streamed token (the demo model, `ft bench serve`
# with its clients in the server's process: one stream at 48 tok/s of its engine's 367; at 0.5 ms, 378).
SWITCH_INTERVAL_S = 0.0005


class Server(uvicorn.Server):
    def __init__(self, app, host: str, port: int, announce: bool = True):
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        super().__init__(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                        timeout_graceful_shutdown=2))
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as e:
            self.sock.close()
            raise OSError(f"cannot listen on {host}:{port}: {e.strerror}") from None
        self.host, self.port = host, self.sock.getsockname()[1]
        self.announce = announce

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self.announce:
            print(f"ready {self.url}", file=sys.stderr, flush=True)

    def serve_forever(self) -> None:
        self.run(sockets=[self.sock])

    def start_in_thread(self, timeout: float = 30.0) -> threading.Thread:
        """For tests and embedding: returns once the server accepts connections."""
        thread = threading.Thread(target=self.serve_forever, daemon=True, name="ft-serve")
        thread.start()
        deadline = time.monotonic() + timeout
        while not self.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self.started:
            raise RuntimeError(f"server did not start on {self.url}")
        return thread

    def stop(self, thread: threading.Thread | None = None, timeout: float = 10.0) -> None:
        self.should_exit = True
        if thread is not None:
            thread.join(timeout)
