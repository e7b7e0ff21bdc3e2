"""Network for a sandboxed call, only to the destinations its caller names (docs/SECURITY.md#network).

The sandbox keeps its own empty network namespace (`--unshare-net`: only a loopback of its own). A gate outside
it, in the service, listens on Unix sockets in a directory bound read-only into the sandbox (`/run/rlctl-net`),
and is the only way out:

- `proxy.sock` speaks HTTP proxy (CONNECT host:port for any TCP stream, TLS included, and absolute-form `GET
  http://…` requests): it connects only to a named `host:port`, and answers 403 to anything else;
- `d<i>.sock`, one per named destination, is connected to that destination and nothing else.

Inside the sandbox, a small relay (RELAY, run by the system's Python before the command) listens on TCP: the
proxy at 127.0.0.1:PROXY_PORT (`http_proxy`/`https_proxy` point there), and, for a destination whose port an
unprivileged process may bind (>= 1024), that very port on the destination's address: a loopback literal as is,
a host name on an address of 127.77.0.0/16 that the sandbox's `/etc/hosts` gives it. So `curl`, `pip`, Python's
`urllib` and `requests` reach https://host/ through the proxy, and a plain socket reaches host:8080 directly.
The relay only forwards bytes: what may be reached is decided outside, by the gate, where the sandbox cannot
change it; killing the relay only takes the sandbox's own network away.

Every address the gate connects to passes `address_refusal`: a name is resolved outside at connect time, and an
address that is not public (loopback, private, link-local, shared, unique-local) is refused unless the server
allows its range (RLCTL_SANDBOX_NETWORK_ALLOW); cloud metadata addresses, unspecified, multicast and reserved
ones are refused always. So a name that resolves to 127.0.0.1 or 169.254.169.254 (DNS rebinding) gets nowhere.
An IPv6 address that carries an IPv4 one (`embedded_ipv4`: NAT64, IPv4-compatible, IPv4-mapped and -translated,
6to4, Teredo) is refused when that IPv4 address would be: where a translator or relay forwards it, it reaches
that IPv4 address.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import select
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlctl.sandbox.errors import DestinationError

IN_SANDBOX_DIR = "/run/rlctl-net"
PROXY_PORT = 3128
NAMED_NET = ipaddress.IPv4Network("127.77.0.0/16")  # in-sandbox addresses of named hosts
MAX_DESTINATIONS = 16
MAX_CONNECTIONS = 32  # at once, per call
MAX_REFUSED_LISTED = 16
CONNECT_TIMEOUT_S = 10.0
HEAD_LIMIT = 16 << 10
_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_HOST_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200")
)
# IPv6 ranges whose addresses carry an IPv4 one in their last 32 bits (RFC 6052 NAT64, RFC 4291 IPv4-compatible
# and IPv4-mapped, RFC 2765 IPv4-translated).
_LAST_32_BITS = tuple(ipaddress.IPv6Network(n) for n in ("64:ff9b::/96", "::/96", "::ffff:0:0/96", "::ffff:0:0:0/96"))
# RFC 8215's local-use NAT64 prefix, inside which a network may use any RFC 6052 prefix length of 48 or more;
# the IPv4 address follows the prefix, skipping bits 64-71 (RFC 6052's "u" octet).
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
_RFC6052_LENGTHS = (48, 56, 64, 96)
METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "metadata.goog", "instance-data"})


def embedded_ipv4(address: _IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 address carries, where a translator or tunnel would deliver it to them; empty
    for an IPv4 address, one without any, and `::`/`::1` (their own IPv6 rules apply)."""
    if isinstance(address, ipaddress.IPv4Address) or int(address) <= 1:
        return ()
    value = int(address)
    if any(address in network for network in _LAST_32_BITS):
        return (ipaddress.IPv4Address(value & 0xFFFFFFFF),)
    if address in _LOCAL_NAT64:  # any prefix length may be in use: every place the address could be
        squeezed = (value >> 64) << 56 | value & ((1 << 56) - 1)  # 120 bits: the u octet taken out
        found = []
        for length in _RFC6052_LENGTHS:
            start = length if length <= 64 else length - 8
            carried = (squeezed >> (120 - start - 32)) & 0xFFFFFFFF
            if carried:  # all zero: that length is not the one in use (0.0.0.0 is no destination anyway)
                found.append(ipaddress.IPv4Address(carried))
        return tuple(dict.fromkeys(found))
    if address.sixtofour is not None:
        return (address.sixtofour,)
    if address.teredo is not None:  # (its server, its client): a relay sends to both
        return address.teredo
    return ()


@dataclass(frozen=True, order=True)
class Destination:
    host: str  # a lower-case name, or an IP address without brackets
    port: int

    @property
    def address(self) -> _IPAddress | None:
        with contextlib.suppress(ValueError):
            return ipaddress.ip_address(self.host)
        return None

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_destination(text: str) -> Destination:
    """`host:port`, `a.b.c.d:port` or `[v6]:port`; raises DestinationError (code NETWORK_DESTINATION_INVALID)."""

    def invalid(why: str) -> DestinationError:
        return DestinationError("NETWORK_DESTINATION_INVALID", f"network destination {text!r}: {why}")

    if not isinstance(text, str) or len(text) > 270:
        raise invalid("must be a string of at most 270 characters, host:port")
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise invalid("an IPv6 address is written [address]:port")
        port_text = rest[1:]
        try:
            address: _IPAddress = ipaddress.IPv6Address(host)
        except ValueError:
            raise invalid("not an IPv6 address") from None
        host = str(address)
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon or not host:
            raise invalid("write host:port (a port is required)")
        host = host.lower().rstrip(".")
        if ":" in host:
            raise invalid("an IPv6 address is written [address]:port")
        try:
            host = str(ipaddress.IPv4Address(host))
        except ValueError:
            if re.fullmatch(r"[0-9.]+", host):
                raise invalid("not an IPv4 address") from None
            if "*" in host:
                raise invalid("wildcards are not supported: name each host") from None
            if len(host) > 253 or not all(_HOST_LABEL.match(label) for label in host.split(".")):
                raise invalid("not a host name (letters, digits, '-' and '.')") from None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise invalid("the port must be a number from 1 to 65535")
    return Destination(host, int(port_text))


def parse_allowed_ranges(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """RLCTL_SANDBOX_NETWORK_ALLOW: comma-separated address ranges (CIDR) that may be named though not public."""
    return tuple(ipaddress.ip_network(part.strip(), strict=False) for part in text.split(",") if part.strip())


@dataclass(frozen=True)
class NetworkPolicy:
    """The destinations a call may reach (a collection's), and the non-public ranges the server lets them reach."""

    destinations: tuple[Destination, ...]
    allowed_ranges: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    def address_refusal(self, address: _IPAddress) -> str | None:
        """Why the gate must not connect to `address`; None when it may."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        for carried in embedded_ipv4(address):
            refusal = self.address_refusal(carried)
            if refusal is not None:
                return f"{address} carries the IPv4 address {carried}: {refusal}"
        if address in METADATA_ADDRESSES:
            return f"{address} is a cloud metadata address (never reachable)"
        if address.is_unspecified or address.is_multicast or address == ipaddress.IPv4Address("255.255.255.255"):
            return f"{address} is not a destination address (never reachable)"
        if any(address in network for network in self.allowed_ranges if network.version == address.version):
            return None
        if address.is_global:
            return None
        kind = "loopback" if address.is_loopback else "link-local" if address.is_link_local else "private"
        return f"{address} is a {kind} address, reachable only where RLCTL_SANDBOX_NETWORK_ALLOW includes it"

    def refusal(self, destination: Destination) -> str | None:
        """Why a collection may not name `destination` (checked at creation; names are checked again, with
        their addresses, at each connection)."""
        if destination.host in METADATA_NAMES or destination.host.endswith(".internal"):
            return f"{destination.host} is a cloud metadata name (never reachable)"
        address = destination.address
        if address is None and (destination.host == "localhost" or destination.host.endswith(".localhost")):
            address = ipaddress.IPv4Address("127.0.0.1")
        return self.address_refusal(address) if address is not None else None


@dataclass
class _Layout:
    """What the sandbox is given: relay listeners (address, port, socket name), /etc/hosts and the proxy env."""

    listeners: list[tuple[str, int, str]] = field(default_factory=list)
    hosts: str = "127.0.0.1 localhost\n::1 localhost\n"
    proxy_port: int = PROXY_PORT


def _layout(destinations: Sequence[Destination]) -> _Layout:
    layout = _Layout()
    taken = {(d.host, d.port) for d in destinations if d.address is not None}
    while ("127.0.0.1", layout.proxy_port) in taken:
        layout.proxy_port += 1
    layout.listeners.append(("127.0.0.1", layout.proxy_port, "proxy.sock"))
    literals = {d.host for d in destinations if d.address is not None}
    named: dict[str, str] = {"localhost": "127.0.0.1"}
    spare = (str(a) for a in NAMED_NET.hosts() if str(a) not in literals)
    for index, destination in enumerate(destinations):
        address = destination.address
        if address is None:
            if destination.host not in named:
                named[destination.host] = next(spare)
                layout.hosts += f"{named[destination.host]} {destination.host}\n"
            bind = named[destination.host]
        elif address.is_loopback and address.version == 4:
            bind = destination.host
        else:
            continue  # not an address of the sandbox's loopback: reached through the proxy only
        bound = {(a, p) for a, p, _ in layout.listeners}
        if destination.port >= 1024 and (bind, destination.port) not in bound:  # 1024: unprivileged ports
            layout.listeners.append((bind, destination.port, f"d{index}.sock"))
    return layout


class Gate:
    """The outside half of one call's network: Unix listeners and the threads that serve them."""

    def __init__(self, policy: NetworkPolicy, owner_uid: int | None) -> None:
        self.policy = policy
        self.layout = _layout(policy.destinations)
        self.directory = Path(tempfile.mkdtemp(prefix="rlctl-net-"))
        self.sockets_dir = self.directory / "s"
        self.sockets_dir.mkdir()
        (self.directory / "hosts").write_text(self.layout.hosts)
        (self.directory / "nsswitch.conf").write_text("hosts: files\n")  # no DNS inside: names are the gate's
        for path in (self.directory, self.sockets_dir):
            path.chmod(0o755)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self.refused: list[str] = []  # destinations asked for and refused, for the tool's result
        targets = {f"d{i}.sock": d for i, d in enumerate(policy.destinations)}
        for _address, _port, name in self.layout.listeners:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            path = self.sockets_dir / name
            listener.bind(str(path))
            path.chmod(0o666)  # the sandbox user (another uid when the service is root) connects to it
            if owner_uid is not None:
                os.chown(path, owner_uid, owner_uid)
            listener.listen(16)
            self._listeners.append(listener)
            thread = threading.Thread(
                target=self._accept, args=(listener, targets.get(name)), name="sandbox-net", daemon=True
            )
            self._threads.append(thread)
        for thread in self._threads:
            thread.start()

    def binds(self) -> list[tuple[str, str]]:
        """(path here, path in the sandbox) of what the sandbox is shown, read-only."""
        return [
            (str(self.sockets_dir), IN_SANDBOX_DIR),
            (str(self.directory / "hosts"), "/etc/hosts"),
            (str(self.directory / "nsswitch.conf"), "/etc/nsswitch.conf"),
        ]

    def environment(self) -> dict[str, str]:
        proxy = f"http://127.0.0.1:{self.layout.proxy_port}"
        return {name: proxy for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}

    def relay_spec(self) -> str:
        return json.dumps([[a, p, f"{IN_SANDBOX_DIR}/{n}"] for a, p, n in self.layout.listeners])

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            sockets = [*self._listeners, *self._open]
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        for thread in self._threads:
            thread.join(timeout=2)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _refuse(self, destination: Destination) -> None:
        with self._lock:  # each once, and a bounded list: a command may try thousands
            if str(destination) not in self.refused and len(self.refused) < MAX_REFUSED_LISTED:
                self.refused.append(str(destination))

    def _accept(self, listener: socket.socket, target: Destination | None) -> None:
        while not self._closed.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                if len(self._open) >= 2 * MAX_CONNECTIONS or self._closed.is_set():
                    client.close()
                    continue
                self._open.add(client)
            threading.Thread(target=self._serve, args=(client, target), name="sandbox-net", daemon=True).start()

    def _serve(self, client: socket.socket, target: Destination | None) -> None:
        upstream: socket.socket | None = None
        try:
            client.settimeout(CONNECT_TIMEOUT_S)
            if target is not None:
                upstream = self._connect(target)
                if upstream is None:
                    return
                pending = b""
            else:
                upstream, pending = self._proxy_head(client)
                if upstream is None:
                    return
            client.settimeout(None)
            if pending:
                upstream.sendall(pending)
            _pump(client, upstream, self._closed)
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()
                    with self._lock:
                        self._open.discard(sock)

    def _proxy_head(self, client: socket.socket) -> tuple[socket.socket | None, bytes]:
        """Reads an HTTP proxy request; answers it and returns the upstream socket and the bytes to forward."""
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                return None, b""
            head += chunk
            if len(head) > HEAD_LIMIT:
                _answer(client, 431, "request head too large")
                return None, b""
        head, _, body = head.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            _answer(client, 400, "not an HTTP proxy request")
            return None, b""
        method, target, version = parts
        if method.upper() == "CONNECT":
            authority, path = target, ""
        elif target.lower().startswith("http://"):
            authority, slash, rest = target[7:].partition("/")
            path = slash + rest or "/"
            if ":" not in authority.rpartition("]")[2]:
                authority += ":80"
        else:
            _answer(client, 400, "only CONNECT host:port and absolute http:// requests are proxied")
            return None, b""
        try:
            destination = parse_destination(authority)
        except DestinationError as error:
            _answer(client, 400, str(error))
            return None, b""
        if destination not in self.policy.destinations:
            self._refuse(destination)
            _answer(client, 403, f"{destination} is not a network destination of this collection")
            return None, b""
        upstream = self._connect(destination, client)
        if upstream is None:
            return None, b""
        if method.upper() == "CONNECT":
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            return upstream, body
        # Plain HTTP: forward in origin form, one request per connection (a second one could name another host).
        headers = [line for line in lines[1:] if not line.lower().startswith(("proxy-", "connection:"))]
        forwarded = "\r\n".join([f"{method} {path} {version}", *headers, "Connection: close", "", ""])
        return upstream, forwarded.encode("latin-1") + body

    def _connect(self, destination: Destination, client: socket.socket | None = None) -> socket.socket | None:
        try:
            infos = socket.getaddrinfo(destination.host, destination.port, type=socket.SOCK_STREAM)
        except OSError as error:
            if client is not None:
                _answer(client, 502, f"{destination}: cannot resolve ({error})")
            return None
        refusals = []
        for family, kind, proto, _name, address in infos:
            refusal = self.policy.address_refusal(ipaddress.ip_address(str(address[0]).split("%")[0]))
            if refusal is not None:
                refusals.append(refusal)
                continue
            upstream = socket.socket(family, kind, proto)
            upstream.settimeout(CONNECT_TIMEOUT_S)
            try:
                upstream.connect(address)
            except OSError as error:
                upstream.close()
                refusals.append(f"{address[0]}: {error.strerror or error}")
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.add(upstream)
            return upstream
        if client is not None:
            refused = any("reachable" in r for r in refusals)
            _answer(client, 403 if refused else 502, f"{destination}: " + "; ".join(refusals or ["no address"]))
        if any("reachable" in r for r in refusals):
            self._refuse(destination)
        return None


def _answer(client: socket.socket, status: int, message: str) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large", 502: "Bad Gateway"}
    body = f"rlctl sandbox network: {message}\n".encode()
    head = f"HTTP/1.1 {status} {reasons[status]}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
    with contextlib.suppress(OSError):
        client.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)


def _pump(a: socket.socket, b: socket.socket, closed: threading.Event) -> None:
    """Copies both ways until both sides have ended (or the call ends)."""
    peers = {a: b, b: a}
    reading = [a, b]
    while reading and not closed.is_set():
        ready, _, _ = select.select(reading, [], [], 1.0)
        for sock in ready:
            data = sock.recv(65536)
            if data:
                peers[sock].sendall(data)
            else:
                reading.remove(sock)
                with contextlib.suppress(OSError):
                    peers[sock].shutdown(socket.SHUT_WR)


# The relay run inside the sandbox by the system's Python (argv: spec, then the command). It binds every
# listener first, then forks the command and forwards bytes until the command ends; its exit status is the
# command's. One thread (threads would count against the sandbox's process limit), non-blocking, bounded buffers.
RELAY = r"""
import json, os, selectors, socket, sys
listeners = []
for host, port, path in json.loads(sys.argv[1]):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(64)
    s.setblocking(False)
    listeners.append((s, path))
pid = os.fork()
if pid == 0:
    for s, _ in listeners:
        s.close()
    os.execv(sys.argv[2], sys.argv[2:])
sel = selectors.DefaultSelector()
for s, path in listeners:
    sel.register(s, selectors.EVENT_READ, path)
child = os.pidfd_open(pid)
sel.register(child, selectors.EVENT_READ, None)
state = {}  # socket -> [peer, bytes to write to it, whether it has ended sending]
def watch(sock):
    if sock not in state:
        return
    peer, out, ended = state[sock]
    events = 0 if ended or len(state[peer][1]) > 262144 else selectors.EVENT_READ
    events |= selectors.EVENT_WRITE if out else 0
    try:
        sel.unregister(sock)
    except (KeyError, ValueError):
        pass
    if events:
        sel.register(sock, events, "pipe")
def drop(sock):
    for end in (sock, state[sock][0]):
        if end in state:
            try:
                sel.unregister(end)
            except (KeyError, ValueError):
                pass
            del state[end]
            end.close()
while True:
    for key, events in sel.select():
        sock = key.fileobj
        if sock is child:
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            sys.exit(code if code >= 0 else 128 - code)
        if key.data != "pipe":
            try:
                conn, _ = sock.accept()
                out = socket.socket(socket.AF_UNIX)
                out.connect(key.data)
            except OSError:
                continue
            conn.setblocking(False)
            out.setblocking(False)
            state[conn] = [out, b"", False]
            state[out] = [conn, b"", False]
            watch(conn)
            watch(out)
            continue
        if sock not in state:
            continue
        peer = state[sock][0]
        try:
            if events & selectors.EVENT_WRITE:
                state[sock][1] = state[sock][1][sock.send(state[sock][1]):]
                if not state[sock][1] and state[peer][2]:
                    sock.shutdown(socket.SHUT_WR)
            if events & selectors.EVENT_READ:
                data = sock.recv(65536)
                state[peer][1] += data
                if not data:
                    state[sock][2] = True
                    if not state[peer][1]:
                        peer.shutdown(socket.SHUT_WR)
            if state[sock][2] and state[peer][2] and not state[sock][1] and not state[peer][1]:
                drop(sock)
                continue
        except OSError:
            drop(sock)
            continue
        watch(sock)
        watch(peer)
"""


def relay_python() -> str | None:
    """A Python interpreter the sandbox can run (it sees only /usr): the service's base interpreter, else the
    system's; None where there is none (the network cannot be given then)."""
    candidates = [Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"]
    candidates += [Path("/usr/bin/python3"), Path("/usr/local/bin/python3")]
    for candidate in candidates:
        resolved = candidate.resolve() if candidate.exists() else None
        if resolved is not None and resolved.parts[:2] == ("/", "usr") and os.access(resolved, os.X_OK):
            return str(resolved)
    return None
