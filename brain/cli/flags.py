"""Flags and flag types shared by the commands: `brain serve`'s duration and
shard-boundary types, and the flags of the commands that build or fill a data
directory (`brain import`, `brain mirror`, `brain snapshot restore`) and talk
to a server as etcdctl does: one definition each, so they read and mean the
same."""

from __future__ import annotations

import argparse

from brain import config as C


def boundaries_type(text: str) -> list[bytes]:
    try:
        return C.parse_shard_boundaries(text)
    except C.ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def seconds_type(text: str) -> float:
    try:
        return C.parse_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_layout_flags(p: argparse.ArgumentParser, shards_default: str = "4") -> None:
    p.add_argument("--name", default=C.DEFAULT_NAME, help="member name to record (default %(default)s)")
    p.add_argument("--shards", type=int, default=None,
                   help=f"number of keyspace shards (default {shards_default}; must match `brain serve --shards`)")
    p.add_argument("--shard-boundaries", type=boundaries_type, default=None,
                   help="comma-separated first keys of shards 2..N (as for `brain serve`)")
    p.add_argument("--replace", action="store_true",
                   help="replace the brain data already in --data-dir (it must not be in use)")


def layout(shards: int | None, boundaries: list[bytes] | None) -> list[bytes]:
    """The shard boundaries the flags ask for (the default layout when
    neither is given); ValueError when they disagree."""
    from brain.mvcc.shard_map import DEFAULT_SHARDS, default_boundaries, layout_problem

    if boundaries is None:
        return default_boundaries(shards if shards is not None else DEFAULT_SHARDS)
    problem = layout_problem(shards, boundaries)
    if problem is not None:
        raise ValueError(problem)
    return boundaries


def add_tls_flags(p: argparse.ArgumentParser) -> None:
    """etcdctl's client TLS flags, and its --user and --password for a
    server with auth on."""
    p.add_argument("--cacert", default="", help="verify the server's certificate with this CA bundle")
    p.add_argument("--cert", default="", help="client certificate (for --client-cert-auth servers)")
    p.add_argument("--key", default="", help="client key")
    p.add_argument("--user", default="", help="username[:password] for a server with auth on")
    p.add_argument("--password", default="", help="password of --user (when it has no :password)")


def user_and_password(args) -> tuple[str, str]:
    """(user, password) from --user name[:password] and --password ("" for no user)."""
    user, sep, password = args.user.partition(":")
    return user, password if sep else args.password
