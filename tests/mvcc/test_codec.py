"""brain.mvcc.codec's journal payloads: the format version every payload
starts with, payloads from before versions were recorded, and a newer
version refused before anything of its payload is applied."""

from __future__ import annotations

import pytest

from brain.backend.memory import MemoryBackend
from brain.mvcc import codec
from brain.mvcc.codec import FORMAT_VERSION, BatchEncoder, FormatVersionError, decode_batch
from brain.mvcc.store import Store


def _payload(main: int, key: bytes) -> bytes:
    enc = BatchEncoder()
    enc.begin_revision(main)
    enc.put(key, b"v", 0)
    return enc.finish()


def test_a_payload_starts_with_its_format_version_and_an_empty_one_is_empty():
    p = _payload(2, b"a")
    # written in the lowest version its entries need: a replica reading
    # only version 1 still follows a journal where auth was never used
    assert p[:2] == b"V\x01"
    assert decode_batch(p) == [("T", 2, [(codec.PUT, b"a", b"v", 0)])]
    assert BatchEncoder().finish() == b""


def test_auth_entries_make_a_version_2_payload_and_are_refused_in_version_1():
    enc = BatchEncoder()
    enc.auth(codec.AUTH_USER_PUT, "u", b"h", False, ("r",))
    enc.auth(codec.AUTH_ROLE_PUT, "r", [(0, b"a", b"b")])
    enc.auth(codec.AUTH_STATUS, True, 7)
    enc.auth(codec.AUTH_TOKEN_ASSIGN, "tok.3", "u")
    enc.auth(codec.AUTH_TOKENS_DROPPED)
    p = enc.finish()
    assert p[:2] == b"V" + bytes((FORMAT_VERSION,)) == b"V\x02"
    assert decode_batch(p) == [("A", codec.AUTH_USER_PUT, "u", b"h", False, ("r",)),
                               ("A", codec.AUTH_ROLE_PUT, "r", ((0, b"a", b"b"),)),
                               ("A", codec.AUTH_STATUS, True, 7), ("A", codec.AUTH_TOKEN_ASSIGN, "tok.3", "u"),
                               ("A", codec.AUTH_TOKENS_DROPPED)]
    with pytest.raises(ValueError):
        decode_batch(b"V\x01" + p[2:])
    for cut in range(3, len(p)):  # cut anywhere inside the entries: bad bytes, never another exception
        try:
            decode_batch(p[:cut])
        except ValueError:
            pass


def test_a_payload_from_before_versions_reads_as_version_1():
    p = _payload(2, b"a")
    assert decode_batch(p[2:]) == decode_batch(p)


def test_joined_payloads_read_as_one():
    assert decode_batch(_payload(2, b"a") + _payload(3, b"b")) == [
        ("T", 2, [(codec.PUT, b"a", b"v", 0)]), ("T", 3, [(codec.PUT, b"b", b"v", 0)])]


def test_a_newer_format_is_refused_with_a_clear_message_and_nothing_applied():
    """The newer part comes second (a batch joining an old-format payload and
    a newer one): the first part must not be applied either."""
    newer = b"V" + bytes((FORMAT_VERSION + 1,)) + _payload(3, b"b")[2:]
    store = Store(MemoryBackend(1))
    with pytest.raises(FormatVersionError) as e:
        store.replay(_payload(2, b"a") + newer)
    assert str(e.value) == (f"journal record format version {FORMAT_VERSION + 1} is newer than this brain reads "
                            f"(up to {FORMAT_VERSION}): upgrade this replica")
    assert isinstance(e.value, ValueError)  # what the replay's callers stop on
    assert store.revision == 1 and store.keys_total() == 0


@pytest.mark.parametrize("bad", [b"V\x00" + _payload(2, b"a")[2:], b"V"], ids=["version 0", "truncated"])
def test_version_0_and_a_truncated_version_entry_are_bad_bytes(bad):
    with pytest.raises(ValueError) as e:
        decode_batch(bad)
    assert not isinstance(e.value, FormatVersionError)
