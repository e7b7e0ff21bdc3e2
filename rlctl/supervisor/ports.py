"""Free loopback ports, so many runs live side by side."""

from __future__ import annotations

import socket
import threading

_recently_given: set[int] = set()
_lock = threading.Lock()


def free_ports(count: int) -> list[int]:
    """Ports free now and not handed out by this process before (a port is used soon after it is chosen)."""
    ports: list[int] = []
    with _lock:
        while len(ports) < count:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            if port not in _recently_given:
                _recently_given.add(port)
                ports.append(port)
        if len(_recently_given) > 4096:
            _recently_given.clear()
    return ports
