"""The contract every backend honours, run over all implementations.

The ``factory``/``backend`` fixtures (conftest.py) are parametrized over the
backend kinds, so each test here runs once per implementation.  Tests that
need persistence skip for the memory backend.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
import threading
import time
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from brain.backend import (
    MAX_KEY_SIZE,
    SHARDS_META_KEY,
    Backend,
    BackendClosedError,
    BackendError,
    BackendFullError,
    BackendStatistics,
    LmdbBackend,
    MemoryBackend,
    ShardCountMismatchError,
    WriteBatch,
    open_backend,
)

from .conftest import KINDS, BackendFactory


def rev(main: int, sub: int = 0) -> bytes:
    return struct.pack(">QQ", main, sub)


def put_all(backend: Backend, shard: int, items: dict[bytes, bytes]) -> None:
    backend.write(WriteBatch(puts=[(shard, k, v) for k, v in items.items()]))


# -- basics -------------------------------------------------------------------


def test_implements_protocol(backend: Backend) -> None:
    assert isinstance(backend, Backend)
    assert backend.shards == 4
    assert backend.get_meta(SHARDS_META_KEY) == b"4"


def test_get_missing_and_present(backend: Backend) -> None:
    assert backend.get(0, rev(1)) is None
    backend.write(WriteBatch(puts=[(0, rev(1), b"one"), (1, rev(1), b"uno")]))
    assert backend.get(0, rev(1)) == b"one"
    assert backend.get(1, rev(1)) == b"uno"
    assert backend.get(2, rev(1)) is None
    assert backend.get(0, rev(2)) is None
    assert type(backend.get(0, rev(1))) is bytes


def test_empty_and_large_values(backend: Backend) -> None:
    big = bytes(range(256)) * 4096  # 1 MiB: LMDB overflow pages
    backend.write(WriteBatch(puts=[(0, b"empty", b""), (0, b"big", big)]))
    assert backend.get(0, b"empty") == b""
    assert backend.get(0, b"big") == big
    assert list(backend.scan(0)) == [(b"big", big), (b"empty", b"")]


def test_get_invalid_keys_are_absent(backend: Backend) -> None:
    put_all(backend, 0, {b"k": b"v"})
    assert backend.get(0, b"") is None
    assert backend.get(0, b"k" * (MAX_KEY_SIZE + 1)) is None
    assert backend.get_many(0, [b"", b"k", b"x" * 600]) == [None, b"v", None]
    assert backend.get_meta(b"") is None
    with pytest.raises(TypeError):
        backend.get(0, "k")  # type: ignore[arg-type]


def test_max_key_size_is_writable(backend: Backend) -> None:
    key = b"k" * MAX_KEY_SIZE
    put_all(backend, 0, {key: b"v"})
    assert backend.get(0, key) == b"v"
    assert list(backend.scan(0)) == [(key, b"v")]


def test_get_many(backend: Backend) -> None:
    put_all(backend, 2, {rev(i): b"v%d" % i for i in range(0, 100, 2)})
    keys = [rev(i) for i in (10, 11, 98, 0, 10, 1000)]
    assert backend.get_many(2, keys) == [b"v10", None, b"v98", b"v0", b"v10", None]
    assert backend.get_many(2, []) == []
    assert backend.get_many(1, keys) == [None] * len(keys)
    assert backend.get_many(2, tuple(keys[:1])) == [b"v10"]


@pytest.mark.parametrize("shard", [-1, 4, 100])
def test_bad_shard(backend: Backend, shard: int) -> None:
    with pytest.raises(ValueError):
        backend.get(shard, b"k")
    with pytest.raises(ValueError):
        backend.get_many(shard, [b"k"])
    with pytest.raises(ValueError):
        backend.scan(shard)
    with pytest.raises(ValueError):
        backend.write(WriteBatch(puts=[(0, b"a", b"a"), (shard, b"k", b"v")]))
    with pytest.raises(ValueError):
        backend.write(WriteBatch(puts=[(0, b"a", b"a")], deletes=[(shard, b"k")]))
    assert backend.get(0, b"a") is None
    assert backend.statistics().writes == 0


# -- scan ---------------------------------------------------------------------

SCAN_KEYS = [b"a", b"a\x00", b"ab", b"b", b"ba", b"c", b"\xff", b"\xff\xff"]


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (b"", None, SCAN_KEYS),
        (b"a", None, SCAN_KEYS),
        (b"a\x00", None, SCAN_KEYS[1:]),
        (b"aa", b"b", [b"ab"]),
        (b"a", b"b", [b"a", b"a\x00", b"ab"]),
        (b"", b"a", []),
        (b"", b"a\x00", [b"a"]),
        (b"b", b"b", []),
        (b"c", b"b", []),
        (b"b", b"b\x00", [b"b"]),
        (b"bb", None, [b"c", b"\xff", b"\xff\xff"]),
        (b"\xff\xff\x00", None, []),
        (b"", b"\xff", SCAN_KEYS[:-2]),
        (b"b" * 600, None, [b"c", b"\xff", b"\xff\xff"]),  # longer than MAX_KEY_SIZE
        (b"a", b"a" * 600, [b"a", b"a\x00"]),
    ],
)
def test_scan_bounds(backend: Backend, start: bytes, end: bytes | None, expected: list[bytes]) -> None:
    put_all(backend, 3, {k: b"<" + k + b">" for k in reversed(SCAN_KEYS)})
    put_all(backend, 2, {b"decoy": b"x"})
    assert list(backend.scan(3, start, end)) == [(k, b"<" + k + b">") for k in expected]


def test_scan_start_longer_than_max_key(backend: Backend) -> None:
    longest = b"b" * MAX_KEY_SIZE
    keys = [b"b", longest, b"b" * (MAX_KEY_SIZE - 1) + b"c", b"c"]
    put_all(backend, 0, {k: b"v" for k in keys})
    assert [k for k, _ in backend.scan(0, longest + b"b")] == keys[2:]
    assert [k for k, _ in backend.scan(0, longest + b"b", longest + b"c")] == []
    assert [k for k, _ in backend.scan(0, longest)] == keys[1:]
    assert [k for k, _ in backend.scan(0, b"", longest + b"\x00")] == keys[:2]


def test_scan_defaults_and_empty_shard(backend: Backend) -> None:
    assert list(backend.scan(0)) == []
    put_all(backend, 0, {rev(i): b"%d" % i for i in range(1000)})
    items = list(backend.scan(0))
    assert [k for k, _ in items] == [rev(i) for i in range(1000)]
    assert list(backend.scan(0, rev(998))) == [(rev(998), b"998"), (rev(999), b"999")]
    assert list(backend.scan(0, end=rev(2))) == [(rev(0), b"0"), (rev(1), b"1")]
    assert list(backend.scan(1)) == []


def test_scan_is_a_snapshot(backend: Backend) -> None:
    put_all(backend, 0, {rev(i): b"old" for i in range(100)})
    untouched = backend.scan(0)  # snapshot taken at the call, before next()
    running = backend.scan(0)
    first = [next(running) for _ in range(10)]
    backend.write(
        WriteBatch(
            puts=[(0, rev(i), b"new") for i in range(0, 200, 2)],
            deletes=[(0, rev(i)) for i in range(1, 100, 2)],
        )
    )
    expected = [(rev(i), b"old") for i in range(100)]
    assert first + list(running) == expected
    assert list(untouched) == expected
    now = list(backend.scan(0))
    assert now == [(rev(i), b"new") for i in range(0, 200, 2)]


def test_abandoned_scans_do_not_block_writes(backend: Backend) -> None:
    put_all(backend, 0, {rev(i): b"v" for i in range(10)})
    scans = [backend.scan(0) for _ in range(50)]
    for s in scans[::2]:
        next(s)
    del scans, s
    put_all(backend, 0, {rev(i): b"w" for i in range(10)})
    assert backend.get(0, rev(3)) == b"w"


# -- write semantics ----------------------------------------------------------


def test_write_is_atomic_across_shards_and_meta(backend: Backend) -> None:
    put_all(backend, 0, {b"keep": b"old"})
    bad_batches = [
        # An invalid key after valid puts, deletes and meta: nothing applies.
        WriteBatch(
            puts=[(0, b"keep", b"new"), (1, b"x", b"y"), (2, b"", b"empty key")],
            deletes=[(0, b"keep")],
            meta={b"m": b"1"},
        ),
        WriteBatch(puts=[(0, b"keep", b"new"), (3, b"k" * (MAX_KEY_SIZE + 1), b"v")]),
        WriteBatch(puts=[(1, b"x", b"y")], deletes=[(0, b"keep"), (0, b"")]),
        WriteBatch(puts=[(1, b"x", b"y")], deletes=[(0, b"keep"), (0, b"k" * 600)]),
        WriteBatch(puts=[(1, b"x", b"y")], meta={b"m": b"1", b"": b"empty"}),
        WriteBatch(puts=[(1, b"x", b"y")], meta={SHARDS_META_KEY: b"7"}),
    ]
    for batch in bad_batches:
        with pytest.raises(ValueError):
            backend.write(batch)
    type_errors = [
        WriteBatch(puts=[(0, b"keep", b"new"), (1, b"x", None)]),  # type: ignore[list-item]
        WriteBatch(puts=[(0, b"keep", b"new"), (1, b"x", "str")]),  # type: ignore[list-item]
        WriteBatch(puts=[(0, b"keep", b"new"), (1, "str", b"v")]),  # type: ignore[list-item]
        WriteBatch(puts=[(0, b"keep", b"new")], meta={b"m": None}),  # type: ignore[dict-item]
    ]
    for batch in type_errors:
        with pytest.raises(TypeError):
            backend.write(batch)
    assert backend.get(0, b"keep") == b"old"
    assert backend.get(1, b"x") is None
    assert backend.get_meta(b"m") is None
    assert backend.get_meta(SHARDS_META_KEY) == b"4"
    stats = backend.statistics()
    assert stats.entries == (1, 0, 0, 0)
    assert stats.writes == 1


def test_batch_order_semantics(backend: Backend) -> None:
    put_all(backend, 0, {b"a": b"1", b"b": b"1", b"c": b"1"})
    backend.write(
        WriteBatch(
            # Deletes apply before puts, whatever the list order suggests;
            # the last of several puts to one key wins.
            puts=[(0, b"a", b"2"), (0, b"d", b"2"), (0, b"d", b"3"), (1, b"a", b"x")],
            deletes=[(0, b"a"), (0, b"b"), (0, b"missing"), (2, b"missing"), (1, b"a")],
        )
    )
    assert list(backend.scan(0)) == [(b"a", b"2"), (b"c", b"1"), (b"d", b"3")]
    assert list(backend.scan(1)) == [(b"a", b"x")]


def test_delete_missing_is_not_an_error(backend: Backend) -> None:
    backend.write(WriteBatch(deletes=[(0, b"nope"), (3, rev(7))]))
    put_all(backend, 0, {b"k": b"v"})
    backend.write(WriteBatch(deletes=[(0, b"k"), (0, b"k")]))
    assert backend.get(0, b"k") is None
    assert backend.statistics().entries == (0, 0, 0, 0)


def test_out_of_order_and_unsorted_puts(backend: Backend) -> None:
    # Exercise both append and non-append insertion paths.
    put_all(backend, 0, {rev(i): b"a" for i in range(100, 200)})
    put_all(backend, 0, {rev(i): b"b" for i in [5, 300, 1, 150, 250, 2]})
    backend.write(WriteBatch(puts=[(0, rev(i), b"c") for i in range(400, 500)] + [(0, rev(400), b"d")]))
    backend.write(WriteBatch(puts=[(0, rev(600), b"e"), (0, rev(600), b"f")]))
    expected = {rev(i): b"a" for i in range(100, 200)}
    expected.update({rev(i): b"b" for i in [5, 300, 1, 150, 250, 2]})
    expected.update({rev(i): b"c" for i in range(401, 500)})
    expected[rev(400)] = b"d"
    expected[rev(600)] = b"f"
    assert list(backend.scan(0)) == sorted(expected.items())


def test_meta(backend: Backend) -> None:
    assert backend.get_meta(b"compacted") is None
    backend.write(WriteBatch(meta={b"compacted": b"5", b"applied": b"9"}))
    assert backend.get_meta(b"compacted") == b"5"
    backend.write(WriteBatch(puts=[(1, rev(1), b"r")], meta={b"compacted": b"6"}))
    assert backend.get_meta(b"compacted") == b"6"
    assert backend.get_meta(b"applied") == b"9"
    assert backend.statistics().entries == (0, 1, 0, 0)  # meta is not a shard


def test_empty_batch_is_a_noop(backend: Backend) -> None:
    backend.write(WriteBatch())
    stats = backend.statistics()
    assert stats.writes == 0
    assert stats.last_write_time is None
    assert stats.entries == (0, 0, 0, 0)


def test_large_batch(backend: Backend) -> None:
    n = 100_000
    value = bytes(range(256)) + bytes(44)  # 300 bytes
    puts = [(i % 4, rev(i), value) for i in range(n)]
    backend.write(WriteBatch(puts=puts, meta={b"applied": b"%d" % n}))
    stats = backend.statistics()
    assert stats.entries == (n // 4,) * 4
    assert stats.in_use_bytes >= n * 316
    assert backend.get(3, rev(n - 1)) == value
    assert backend.get(0, rev(n - 1)) is None
    assert backend.get_many(1, [rev(1), rev(2), rev(n - 3)]) == [value, None, value]
    assert sum(1 for _ in backend.scan(2)) == n // 4
    backend.write(WriteBatch(deletes=[(i % 4, rev(i)) for i in range(n)]))
    assert backend.statistics().entries == (0, 0, 0, 0)
    assert backend.get_meta(b"applied") == b"%d" % n


def test_statistics(backend: Backend) -> None:
    before = backend.statistics()
    assert isinstance(before, BackendStatistics)
    assert before.writes == 0 and before.last_write_seconds == 0.0
    put_all(backend, 1, {rev(i): b"x" * 300 for i in range(1000)})
    after = backend.statistics()
    assert after.entries == (0, 1000, 0, 0)
    assert after.writes == 1
    assert after.last_write_seconds > 0
    assert after.last_write_time is not None and after.last_write_time <= time.time()
    assert after.in_use_bytes > before.in_use_bytes
    assert after.size_bytes >= after.in_use_bytes >= 1000 * 316
    with pytest.raises(Exception):
        after.writes = 5  # type: ignore[misc]  # frozen


# -- lifecycle ----------------------------------------------------------------


def test_release_read_pages_keeps_every_read_working(backend: Backend) -> None:
    """Whatever a store gives back, reads after it (and a scan begun
    before it) see the same data."""
    put_all(backend, 2, {rev(i): b"v%d" % i * 100 for i in range(300)})
    scan = backend.scan(2)
    first = next(scan)
    backend.release_read_pages()
    assert backend.get(2, rev(7)) == b"v7" * 100
    assert [k for k, _ in [first, *scan]] == [rev(i) for i in range(300)]
    backend.release_read_pages()  # again: nothing mapped is fine


def _file_rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def test_lmdb_release_read_pages_unmaps_what_a_scan_read(tmp_path: Path) -> None:
    """A restart's scan maps every page of the data file into the process;
    after release_read_pages they are no longer counted in its RSS."""
    with LmdbBackend(tmp_path / "db", 1) as b:
        for chunk in range(8):  # 64 MiB of records
            b.write(WriteBatch(puts=[(0, rev(chunk * 1000 + i), bytes(8192)) for i in range(1000)]))
        before = _file_rss_kb()
        assert sum(len(v) for _, v in b.scan(0)) == 8000 * 8192
        scanned = _file_rss_kb()
        b.release_read_pages()
        after = _file_rss_kb()
        assert scanned - before > 40_000, (before, scanned)
        assert after < before + 10_000, (before, scanned, after)
        assert b.get(0, rev(5)) == bytes(8192)


def test_close(factory: BackendFactory) -> None:
    backend = factory.open()
    put_all(backend, 0, {b"k": b"v"})
    scan = backend.scan(0)
    backend.close()
    backend.close()  # idempotent
    for call in (
        lambda: backend.get(0, b"k"),
        lambda: backend.get_many(0, [b"k"]),
        lambda: backend.scan(0),
        lambda: backend.write(WriteBatch(puts=[(0, b"k", b"v")])),
        lambda: backend.write(WriteBatch()),
        lambda: backend.get_meta(b"k"),
        lambda: backend.statistics(),
        lambda: list(scan),
    ):
        with pytest.raises(BackendClosedError):
            call()


def test_reopen_persists(persistent_factory: BackendFactory) -> None:
    factory = persistent_factory
    backend = factory.open(shards=3)
    backend.write(WriteBatch(puts=[(s, rev(i), b"%d/%d" % (s, i)) for s in range(3) for i in range(50)]))
    backend.write(WriteBatch(deletes=[(1, rev(7))], meta={b"applied": b"2"}))
    backend.close()
    backend = factory.open(shards=3)
    assert backend.get(2, rev(49)) == b"2/49"
    assert backend.get(1, rev(7)) is None
    assert backend.get_meta(b"applied") == b"2"
    assert backend.get_meta(SHARDS_META_KEY) == b"3"
    stats = backend.statistics()
    assert stats.entries == (50, 49, 50)
    assert stats.writes == 0  # counted per instance
    assert [k for k, _ in backend.scan(0)] == [rev(i) for i in range(50)]


def test_shard_count_mismatch(persistent_factory: BackendFactory) -> None:
    factory = persistent_factory
    factory.open(shards=4).close()
    for wrong in (3, 5, 1):
        with pytest.raises(ShardCountMismatchError, match="4 shards"):
            factory.open(shards=wrong)
    with pytest.raises(ValueError):  # also a ValueError
        factory.open(shards=2)
    backend = factory.open(shards=4)  # the failed opens left nothing open
    assert backend.shards == 4


def test_full(factory: BackendFactory) -> None:
    capacity = 1 << 20
    backend = factory.open(shards=2, capacity=capacity)
    put_all(backend, 0, {rev(i): b"a" * 300 for i in range(100)})
    big = WriteBatch(puts=[(1, rev(i), b"b" * 300) for i in range(capacity // 300)], meta={b"m": b"1"})
    with pytest.raises(BackendFullError):
        backend.write(big)
    assert isinstance(BackendFullError("x"), BackendError)
    assert backend.statistics().entries == (100, 0)
    assert backend.get(1, rev(0)) is None
    assert backend.get_meta(b"m") is None
    assert backend.get(0, rev(99)) == b"a" * 300
    # The store is still usable and the failed batch left no garbage behind.
    put_all(backend, 1, {rev(i): b"c" * 300 for i in range(100)})
    assert backend.statistics().entries == (100, 100)


def test_concurrent_readers_see_whole_batches(factory: BackendFactory) -> None:
    """Readers racing a writer see each batch entirely or not at all."""
    backend = factory.open(shards=2)
    keys = [rev(i) for i in range(300)]

    def batch(gen: int) -> WriteBatch:
        value = b"%08d" % gen * 20
        return WriteBatch(
            puts=[(s, k, value) for s in (0, 1) for k in keys], meta={b"gen": b"%d" % gen}
        )

    backend.write(batch(0))
    generations = 40
    readers = 4
    started = threading.Barrier(readers + 1)
    done = threading.Event()
    errors: list[BaseException] = []
    seen: list[set[int]] = [set() for _ in range(readers)]

    def read(idx: int) -> None:
        try:
            started.wait()
            last = 0  # a generation known to be committed
            while not done.is_set():
                gens0 = {int(v[:8]) for v in backend.get_many(0, keys)}
                gens1 = {int(v[:8]) for _, v in backend.scan(1)}
                meta = int(backend.get_meta(b"gen") or b"-1")
                gens2 = {int(v[:8]) for v in backend.get_many(1, keys)}
                assert len(gens0) == 1 and len(gens1) == 1 and len(gens2) == 1, "saw a mix"
                (g0,), (g1,), (g2,) = gens0, gens1, gens2
                # Batches commit shard 0, shard 1 and meta together, so what
                # one read saw committed, every later read sees too.
                assert last <= g0 <= g1 <= meta <= g2, (last, g0, g1, meta, g2)
                last = g2
                seen[idx].update((g0, g1, meta, g2))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
    for t in threads:
        t.start()
    started.wait()
    for gen in range(1, generations + 1):
        backend.write(batch(gen))
        time.sleep(0.002)  # let readers run between batches
    done.set()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    all_seen = set().union(*seen)
    assert len(all_seen) > 1, "readers never overlapped the writer"
    assert backend.get_meta(b"gen") == b"%d" % generations


def test_concurrent_readers_single_call_consistency(factory: BackendFactory) -> None:
    """Each single read call (get_many, scan) observes exactly one batch."""
    backend = factory.open(shards=1)
    keys = [rev(i) for i in range(2000)]
    backend.write(WriteBatch(puts=[(0, k, b"0") for k in keys]))
    done = threading.Event()
    errors: list[BaseException] = []
    reads = [0]

    def read() -> None:
        try:
            while not done.is_set():
                assert len(set(backend.get_many(0, keys))) == 1
                assert len({v for _, v in backend.scan(0)}) == 1
                reads[0] += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for gen in range(1, 30):
        backend.write(WriteBatch(puts=[(0, k, b"%d" % gen) for k in keys]))
        time.sleep(0.001)
    done.set()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    assert reads[0] > 0


def test_open_backend(tmp_path: Path) -> None:
    with open_backend("memory", None, 2) as mem:
        assert isinstance(mem, MemoryBackend) and mem.shards == 2
    with open_backend("lmdb", tmp_path / "db", 3) as db:
        assert isinstance(db, LmdbBackend) and db.shards == 3
    with pytest.raises(ValueError):
        open_backend("rocksdb", tmp_path / "x", 1)
    with pytest.raises(ValueError):
        open_backend("lmdb", None, 1)
    with pytest.raises(ValueError):
        open_backend("memory", None, 0)


def test_lmdb_layout(tmp_path: Path) -> None:
    import lmdb

    with LmdbBackend(tmp_path / "db", 3) as backend:
        backend.write(WriteBatch(puts=[(2, rev(1), b"v")]))
    env = lmdb.open(str(tmp_path / "db"), max_dbs=8, readonly=True)
    try:
        assert sorted(env.begin().cursor().iternext(values=False)) == [
            b"meta",
            b"shard-0000",
            b"shard-0001",
            b"shard-0002",
        ]
    finally:
        env.close()
    assert (tmp_path / "db").stat().st_mode & 0o777 == 0o700


# -- model-based --------------------------------------------------------------

STATEFUL_SHARDS = 3
key_st = st.one_of(
    st.sampled_from([b"a", b"ab", b"b", b"\x00", b"\xff", rev(1), rev(1, 1), rev(2)]),
    st.binary(min_size=1, max_size=3),
)
value_st = st.binary(max_size=40)
shard_st = st.integers(0, STATEFUL_SHARDS - 1)
bound_st = st.one_of(st.just(b""), key_st)


class BackendMachine(RuleBasedStateMachine):
    """Random batches against a dict-of-dicts model of the contract."""

    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="backend-machine-")
        self.model: list[dict[bytes, bytes]] = [{} for _ in range(STATEFUL_SHARDS)]
        self.meta: dict[bytes, bytes] = {SHARDS_META_KEY: b"%d" % STATEFUL_SHARDS}
        self.backend = self._open()

    def _open(self) -> Backend:
        return open_backend(self.kind, Path(self.directory) / "db", STATEFUL_SHARDS)

    def teardown(self) -> None:
        self.backend.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    @rule(
        puts=st.lists(st.tuples(shard_st, key_st, value_st), max_size=12),
        deletes=st.lists(st.tuples(shard_st, key_st), max_size=6),
        meta=st.dictionaries(key_st, value_st, max_size=3),
    )
    def write(self, puts, deletes, meta) -> None:
        self.backend.write(WriteBatch(puts=puts, deletes=deletes, meta=meta))
        for shard, key in deletes:
            self.model[shard].pop(key, None)
        for shard, key, value in puts:
            self.model[shard][key] = value
        self.meta.update(meta)

    @rule(
        puts=st.lists(st.tuples(shard_st, key_st, value_st), max_size=6),
        bad=st.sampled_from(["empty key", "long key", "bad shard", "reserved meta"]),
    )
    def write_invalid(self, puts, bad) -> None:
        batch = WriteBatch(puts=list(puts), deletes=[(0, b"a")], meta={b"m": b"x"})
        if bad == "empty key":
            batch.puts.append((1, b"", b"v"))
        elif bad == "long key":
            batch.deletes.append((2, b"z" * (MAX_KEY_SIZE + 1)))
        elif bad == "bad shard":
            batch.puts.append((STATEFUL_SHARDS, b"k", b"v"))
        else:
            batch.meta[SHARDS_META_KEY] = b"9"
        with pytest.raises(ValueError):
            self.backend.write(batch)

    @rule(shard=shard_st, key=key_st)
    def get(self, shard, key) -> None:
        assert self.backend.get(shard, key) == self.model[shard].get(key)

    @rule(shard=shard_st, keys=st.lists(key_st, max_size=8))
    def get_many(self, shard, keys) -> None:
        assert self.backend.get_many(shard, keys) == [self.model[shard].get(k) for k in keys]

    @rule(shard=shard_st, start=bound_st, end=st.one_of(st.none(), bound_st))
    def scan(self, shard, start, end) -> None:
        expected = sorted(
            (k, v) for k, v in self.model[shard].items() if k >= start and (end is None or k < end)
        )
        assert list(self.backend.scan(shard, start, end)) == expected

    @rule(key=key_st)
    def get_meta(self, key) -> None:
        assert self.backend.get_meta(key) == self.meta.get(key)

    @invariant()
    def entries(self) -> None:
        assert self.backend.statistics().entries == tuple(len(m) for m in self.model)


class MemoryMachine(BackendMachine):
    kind = "memory"


class LmdbMachine(BackendMachine):
    kind = "lmdb"

    @rule()
    def reopen(self) -> None:
        self.backend.close()
        self.backend = self._open()


_machine_settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestMemoryModel = MemoryMachine.TestCase
TestMemoryModel.settings = _machine_settings
TestLmdbModel = LmdbMachine.TestCase
TestLmdbModel.settings = _machine_settings


def test_model_covers_every_kind() -> None:
    assert {MemoryMachine.kind, LmdbMachine.kind} == set(KINDS)
