"""The journal's JetStream stream: its names, the settings brain creates it
with and refuses to live without, and the JetStream API requests about it.

One stream ``<name>_journal`` with one subject ``<name>.journal``, file
storage, replicated by the NATS cluster (R3 with three servers or more),
limits retention with no limit that would drop a record, and a duplicate
window long enough for a writer's retried publishes (brain.journal.
jetstream).  A stream that exists with other settings is refused, never
changed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from .errors import JournalError, JournalUnavailableError
from .natsio import NatsConnection

log = logging.getLogger("brain.journal.jetstream")

ERR_STREAM_NOT_FOUND = 10059
DUPLICATE_WINDOW_SECONDS = 120


def stream_names(name: str) -> tuple[str, str]:
    """(stream, subject) of cluster ``name``'s journal."""
    return f"{name}_journal", f"{name}.journal"


@dataclass(frozen=True)
class StreamState:
    first_seq: int
    last_seq: int
    messages: int
    bytes: int
    replicas: int
    leader: str | None


class StreamSettingsError(JournalError):
    """The stream exists with settings a journal cannot live with."""


def api_error(resp: dict) -> tuple[int, str] | None:
    err = resp.get("error")
    if not err:
        return None
    return int(err.get("err_code") or 0), str(err.get("description") or err)


def required_config(stream: str, subject: str, replicas: int) -> dict:
    """The stream configuration brain creates (and checks on open)."""
    return {
        "name": stream,
        "subjects": [subject],
        "retention": "limits",
        "storage": "file",
        "num_replicas": replicas,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": 0,
        "max_msgs_per_subject": -1,
        "max_msg_size": -1,
        "discard": "old",
        "duplicate_window": DUPLICATE_WINDOW_SECONDS * 1_000_000_000,
        "deny_delete": True,
        "deny_purge": False,
        "allow_rollup_hdrs": False,
        "allow_direct": False,
    }


def check_config(stream: str, config: dict) -> None:
    """Refuse a stream whose settings would lose journal records."""
    problems = []
    if config.get("storage") != "file":
        problems.append(f"storage is {config.get('storage')!r} (a journal needs file storage)")
    if config.get("retention") not in (None, "limits"):
        problems.append(f"retention is {config.get('retention')!r} (it must be 'limits')")
    for limit in ("max_msgs", "max_bytes", "max_msgs_per_subject"):
        value = config.get(limit, -1)
        if value not in (-1, 0, None):
            problems.append(f"{limit} is {value} (records past it would be dropped)")
    if config.get("max_age"):
        problems.append(f"max_age is {config['max_age'] / 1e9:g}s (old records would be dropped)")
    if config.get("allow_rollup_hdrs"):
        problems.append("allow_rollup_hdrs is on (a rollup would erase records)")
    if config.get("sealed"):
        problems.append("the stream is sealed")
    if problems:
        raise StreamSettingsError(
            f"JetStream stream {stream} exists with settings a brain journal cannot use: "
            + "; ".join(problems)
            + ". Delete it (nats stream rm) or choose another cluster name in --journal-url.")


def provision(conn: NatsConnection, name: str, *, replicas: int, create: bool,
              timeout: float) -> tuple[str, str, dict]:
    """(stream, subject, its STREAM.INFO) of cluster ``name``'s journal: the
    stream is created with ``replicas`` replicas when missing, and refused
    when it exists with settings that would lose records."""
    stream, subject = stream_names(name)
    info = conn.run(api_request(conn, f"$JS.API.STREAM.INFO.{stream}", b""), timeout)
    err = api_error(info)
    if err and err[0] == ERR_STREAM_NOT_FOUND:
        if not create:
            raise JournalError(f"JetStream stream {stream} does not exist")
        body = json.dumps(required_config(stream, subject, replicas)).encode()
        info = conn.run(api_request(conn, f"$JS.API.STREAM.CREATE.{stream}", body), timeout)
        err = api_error(info)
        if err:
            raise JournalError(f"cannot create JetStream stream {stream}: {err[1]} (code {err[0]})")
        log.info("created JetStream stream %s (R%d)", stream, replicas)
    elif err:
        raise JournalError(f"cannot read JetStream stream {stream}: {err[1]} (code {err[0]})")
    else:
        config = info.get("config", {})
        if config.get("subjects") != [subject]:
            raise StreamSettingsError(
                f"JetStream stream {stream} exists with subjects {config.get('subjects')}, not [{subject}]; "
                "it is not a brain journal. Choose another cluster name in --journal-url.")
        check_config(stream, config)
    return stream, subject, info


def stream_state(info: dict) -> StreamState:
    """A STREAM.INFO answer's state; JournalUnavailableError for an error answer."""
    err = api_error(info)
    if err:
        raise JournalUnavailableError(f"stream info: {err[1]}")
    st = info.get("state", {})
    cluster = info.get("cluster", {}) or {}
    return StreamState(max(1, int(st.get("first_seq", 1) or 1)), int(st.get("last_seq", 0)),
                       int(st.get("messages", 0)), int(st.get("bytes", 0)),
                       int(info.get("config", {}).get("num_replicas", 1)), cluster.get("leader"))


def jetstream_api(conn: NatsConnection, subject: str, payload: dict | None = None, timeout: float = 5.0) -> dict:
    """(any thread but the connection's) One JetStream API request, its
    decoded reply; an error reply (``api_error``) is returned, not raised."""
    body = json.dumps(payload).encode() if payload is not None else b""
    return conn.run(api_request(conn, subject, body, timeout), timeout + 1)


async def api_request(conn: NatsConnection, subject: str, body: bytes, timeout: float = 5.0) -> dict:
    """(on the connection's loop) One JetStream API request, its decoded reply (an error reply too)."""
    import nats.errors

    try:
        msg = await conn.request(subject, body, timeout=timeout)
    except nats.errors.NoRespondersError:
        return {"error": {"err_code": 0, "description": "no responders (JetStream has no leader for this stream)"}}
    return json.loads(msg.data or b"{}")
