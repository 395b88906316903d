"""What `brain serve` checks before it touches the data directory.

Recovery of a large data dir takes a while, and creating the directory
leaves a trace, so a port that is taken, a key file brain cannot read or a
data dir that cannot be one is reported first, naming the real cause:

* every client and metrics listener is test-bound (SO_REUSEADDR, as grpc
  and the metrics server bind, so a restart's TIME_WAIT connections do not
  count) and released at once; the real bind still reports a port taken in
  between.  Messages read like etcd's: ``listen tcp 127.0.0.1:2379: bind:
  address already in use``;
* --cert-file, --key-file and --trusted-ca-file are read and loaded with
  OpenSSL when a listener uses TLS, and --client-crl-file is parsed as
  etcd parses it; "Permission denied" says which user brain runs as and
  who owns the file (the usual cause: a static pod's uid and root-owned
  keys);
* the data dir is created 0700, or checked when present: a regular file, a
  parent that is a file, a pseudo filesystem such as /proc or a directory
  brain cannot write each get their own message instead of the bare errno
  (mkdir under /proc says "No such file or directory").

When there is no space left, here or later while the data dir opens, the
message says how much is free and where (``free_space``).

Nothing here knows grpc; the transports bind for real afterwards.
"""

from __future__ import annotations

import errno
import os
import socket
import ssl
import stat

from brain.config import ConfigError, ListenURL, ServerConfig, parse_listen_url

# Kernel filesystems that cannot hold a data directory.
PSEUDO_FILESYSTEMS = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "devpts", "securityfs", "debugfs", "tracefs",
    "bpf", "pstore", "configfs", "fusectl", "mqueue", "hugetlbfs", "binfmt_misc", "efivarfs",
})


class StartupError(RuntimeError):
    """A reason brain cannot serve, worded for the operator."""


def check_before_data_dir(config: ServerConfig) -> None:
    """Listeners, then TLS files, then the data dir (created if missing)."""
    check_listeners(config)
    check_tls_files(config)
    prepare_data_dir(config.data_dir)


# --- listeners -----------------------------------------------------------------


def _metrics_listeners(config: ServerConfig) -> list[ListenURL]:
    out = []
    for url in config.listen_metrics_urls:
        try:
            out.append(parse_listen_url(url))
        except ConfigError as e:
            raise StartupError(f"--listen-metrics-urls: {e}") from None
    return out


def check_listeners(config: ServerConfig) -> None:
    for lu in config.listeners():
        if lu.is_unix:
            _check_unix(lu)
        else:
            _probe_tcp(lu, reuse_port=config.socket_reuse_port)
    for lu in _metrics_listeners(config):
        if lu.is_unix:
            _check_unix(lu)
        else:
            _probe_tcp(lu)


def _probe_tcp(lu: ListenURL, reuse_port: bool = False) -> None:
    host, _, port = lu.address.rpartition(":")
    host = host.strip("[]") or None
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # a name that does not resolve: the real bind reports it
    for family, kind, proto, _name, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:  # --socket-reuse-port: sharing the port is the point
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                s.bind(addr)
            except OSError as e:
                raise StartupError(f"listen tcp {lu.address}: bind: {_reason(e)}") from None


def _check_unix(lu: ListenURL) -> None:
    """A leftover socket is replaced at bind time (as etcd does); anything
    else at the path, or a directory brain cannot write, fails the bind."""
    path = lu.path
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise StartupError(f"listen unix {path}: bind: {_reason(e)}") from None
    if st is not None and not stat.S_ISSOCK(st.st_mode):
        raise StartupError(f"listen unix {path}: bind: address already in use ({path} is {_kind(st)})")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise StartupError(f"listen unix {path}: bind: no such file or directory ({parent} does not exist)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StartupError(f"listen unix {path}: bind: permission denied ({_whose(parent)})")


# --- TLS files -----------------------------------------------------------------


def _uses_tls(config: ServerConfig) -> bool:
    return any(lu.secure for lu in [*config.listeners(), *_metrics_listeners(config)])


def _no_password() -> bytes:
    raise StartupError("--key-file is encrypted; brain needs an unencrypted key")


def check_tls_files(config: ServerConfig) -> None:
    if not _uses_tls(config):
        return  # the server ignores the files then (and logs that it does)
    files = [("--cert-file", config.cert_file), ("--key-file", config.key_file),
             ("--trusted-ca-file", config.trusted_ca_file)]
    for flag, path in files:
        if path:
            _check_pem(flag, path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(config.cert_file, config.key_file, password=_no_password)
    except ssl.SSLError as e:
        raise StartupError(
            f"--cert-file {config.cert_file} with --key-file {config.key_file}: {_ssl_reason(e)}") from None
    if config.trusted_ca_file:
        try:
            ctx.load_verify_locations(cafile=config.trusted_ca_file)
        except ssl.SSLError as e:
            raise StartupError(f"--trusted-ca-file {config.trusted_ca_file}: {_ssl_reason(e)}") from None
    if config.client_crl_file:
        check_crl_file(config.client_crl_file)


def check_crl_file(path: str) -> None:
    """--client-crl-file can be read and parsed as etcd parses it (DER).
    etcd starts with a broken one and then refuses every client
    certificate; brain says so before it serves."""
    flag = "--client-crl-file"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        detail = f" ({_whose(path)})" if e.errno in (errno.EACCES, errno.EPERM) else ""
        raise StartupError(f"{flag} {path}: {e.strerror or e}{detail}") from None
    from brain.api import native_front

    if not native_front.available():
        return  # the front's own check names the missing module
    try:
        native_front.check_crl(data)
    except ValueError as e:
        hint = ""
        if data.lstrip().startswith(b"-----BEGIN"):
            hint = (" (the file is PEM; etcd and brain read a DER CRL: "
                    f"openssl crl -in {path} -outform DER -out crl.der)")
        raise StartupError(f"{flag} {path}: {e}{hint}") from None


_PEM_MARKERS = {"--cert-file": b"CERTIFICATE-----", "--key-file": b"PRIVATE KEY-----",
                "--trusted-ca-file": b"CERTIFICATE-----"}


def _check_pem(flag: str, path: str) -> None:
    """Readable, and holding the PEM block the flag needs (OpenSSL's own
    message for an empty or wrong file is "[SSL] PEM lib")."""
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError as e:
        detail = f" ({_whose(path)})" if e.errno in (errno.EACCES, errno.EPERM) else ""
        raise StartupError(f"{flag} {path}: {e.strerror or e}{detail}") from None
    marker = _PEM_MARKERS[flag]
    if marker not in data:
        what = "private key" if flag == "--key-file" else "certificate"
        raise StartupError(f"{flag} {path}: no PEM {what} in it (a '-----BEGIN ...{marker.decode()}' block)")


def _ssl_reason(e: ssl.SSLError) -> str:
    reason = getattr(e, "reason", None)
    return reason.lower().replace("_", " ") if reason else str(e)


# --- data dir ------------------------------------------------------------------


def prepare_data_dir(path: str) -> None:
    """Create ``path`` (0700, with its parents) or check the one there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        st = None  # a parent is a file: named below
    except OSError as e:
        raise StartupError(f"cannot use data dir {path}: {e.strerror or e}") from None
    if st is not None:
        _check_existing(path, st)
        return
    ancestor = _nearest_existing(path)
    ast = os.stat(ancestor)
    if not stat.S_ISDIR(ast.st_mode):
        raise StartupError(f"cannot create data dir {path}: {ancestor} is {_kind(ast)}, not a directory")
    _refuse_pseudo_fs(path, ancestor, "create")
    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        _check_existing(path, os.stat(path))  # created meanwhile
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            raise StartupError(
                f"cannot create data dir {path}: permission denied ({_whose(ancestor)})") from None
        if e.errno == errno.EROFS:
            raise StartupError(f"cannot create data dir {path}: {ancestor} is on a read-only file system") from None
        space = f"; {free_space(ancestor)}" if e.errno in NO_SPACE_ERRNOS else ""
        raise StartupError(f"cannot create data dir {path} in {ancestor}: {e.strerror or e}{space}") from None


def _check_existing(path: str, st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise StartupError(f"data dir {path} is {_kind(st)}, not a directory")
    _refuse_pseudo_fs(path, path, "use")
    if not os.access(path, os.W_OK | os.X_OK):
        raise StartupError(f"cannot use data dir {path}: permission denied ({_whose(path)})")


def _refuse_pseudo_fs(path: str, where: str, verb: str) -> None:
    fstype, mountpoint = filesystem_of(where)
    if fstype in PSEUDO_FILESYSTEMS:
        raise StartupError(
            f"cannot {verb} data dir {path}: {mountpoint} is a {fstype} filesystem (kernel state, "
            f"not storage); choose a directory on a disk")


def _nearest_existing(path: str) -> str:
    """The closest ancestor that exists; for a path through a file
    (``file/sub/dir``) that is the file."""
    p = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return p


def filesystem_of(path: str) -> tuple[str, str]:
    """(fstype, mount point) of the mount holding ``path``, from
    /proc/self/mounts; ("", "") where that is not readable."""
    real = os.path.realpath(path)
    best = ("", "")
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mnt = fields[1].encode().decode("unicode_escape") if "\\" in fields[1] else fields[1]
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best[1]):
            best = (fields[2], mnt)
    return best


NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def free_space(path: str) -> str:
    """How much is free for brain on the filesystem holding ``path`` (the
    nearest existing part of it), and which one: "N bytes free on MOUNT
    (FSTYPE)"."""
    where = path if os.path.exists(path) else _nearest_existing(path)
    try:
        st = os.statvfs(where)
    except OSError as e:
        return f"free space on {where} unknown ({e.strerror or e})"
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    fstype, mountpoint = filesystem_of(where)
    return f"{free} bytes free on {mountpoint or where}" + (f" ({fstype})" if fstype else "")


# --- wording -------------------------------------------------------------------


def _reason(e: OSError) -> str:
    return (e.strerror or str(e)).lower()


def _kind(st: os.stat_result) -> str:
    mode = st.st_mode
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _whose(path: str) -> str:
    """Who brain runs as and who owns the first part of ``path`` that
    stops it: what an operator needs to fix a Permission denied."""
    blocker = path
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts)):
        d = os.sep.join(parts[:i])
        if os.path.isdir(d) and not os.access(d, os.X_OK):
            blocker = d
            break
    me = f"brain runs as uid {os.geteuid()} gid {os.getegid()}"
    try:
        st = os.stat(blocker)
    except OSError:
        return me
    return f"{me}; {blocker} is owned by {st.st_uid}:{st.st_gid} with mode {stat.S_IMODE(st.st_mode):04o}"
