"""What the native transport's listeners are given: TLS settings in its
shape, and a TCP socket bound with SO_REUSEPORT (etcd's --socket-reuse-port),
which the transport adopts by its file descriptor (brain.api.native_front
binds everything else through the transport itself)."""

from __future__ import annotations

import socket


class TlsFiles:
    """What an https:// or unixs:// listener needs, in the transport's
    shape (see brain.config for the flags; ``allowed_cns``,
    ``allowed_hostnames`` and ``crl_file`` narrow who may connect with a
    client certificate, as etcd's flags do: native/src/narrowing.rs)."""

    def __init__(self, cert_file: str, key_file: str, ca_file: str | None, client_auth: bool,
                 cipher_suites=(), min_tls13: bool = False, max_tls12: bool = False, *,
                 allowed_cns=(), allowed_hostnames=(), crl_file: str | None = None) -> None:
        self.args = (cert_file, key_file, ca_file or None, bool(client_auth), list(cipher_suites),
                     bool(min_tls13), bool(max_tls12), list(allowed_cns), list(allowed_hostnames), crl_file or None)


def reuse_port_socket(host: str, port: int) -> int:
    """A listening TCP socket's file descriptor, bound now (a taken port
    fails here) with SO_REUSEPORT, so several servers on one machine
    (replicas of one cluster) share the port and the kernel spreads
    connections over them.  The caller owns the descriptor."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((host, port))
        s.listen(1024)
        s.setblocking(False)
    except BaseException:
        s.close()
        raise
    return s.detach()


__all__ = ["TlsFiles", "reuse_port_socket"]
