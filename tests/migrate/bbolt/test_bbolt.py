"""brain.migrate.bbolt: our reader reads what our writer writes (random buckets with
nested, inline, empty and overflowing contents), damage is reported with the
page, and real bbolt (inside etcd's tools) finds our files consistent."""

from __future__ import annotations

import json
import random
import struct
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brain.migrate.bbolt import BoltError, BoltFile, BoltWriter
from brain.migrate.bbolt.layout import BUCKET_HEADER, LEAF_PAGE, PAGE_HEADER, fnv1a64
from tests.support.etcd_tools import etcd_tool


def write(path, buckets, page_size=4096):
    """buckets: {name: items or nested dict}, written in name order."""
    with open(path, "w+b") as f:
        w = BoltWriter(f, page_size)

        def build(spec):
            items = []
            for k in sorted(spec):
                v = spec[k]
                items.append((k, build(v) if isinstance(v, dict) else v))
            return w.bucket(items)

        size = w.finish([(name, build(spec)) for name, spec in sorted(buckets.items())])
    return size


def read(bucket):
    out = {}
    for k, v, flags in bucket.items():
        out[k] = read(bucket.bucket(k)) if flags & 1 else v
    return out


def test_fnv1a64_known_values():
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


def test_roundtrip_every_shape(tmp_path):
    rng = random.Random(7)
    keys = sorted({rng.randbytes(rng.randint(1, 60)) for _ in range(5000)})
    big = {k: rng.randbytes(rng.choice([0, 1, 40, 900, 5000, 70000])) for k in keys}
    spec = {
        b"big": big,
        b"empty": {},
        b"inline": {b"a": b"1", b"b": b""},
        b"nested": {b"child": {b"x": b"y"}, b"deep": {b"d2": {b"d3": {b"k": b"v"}}}, b"plain": b"p"},
        b"one-huge": {b"k": b"z" * 100_000},
    }
    path = tmp_path / "db"
    size = write(path, spec)
    assert path.stat().st_size == size and size % 4096 == 0
    with BoltFile(str(path)) as db:
        assert read(db.root()) == spec
        b = db.bucket(b"big")
        for k in keys[::37]:
            assert b.get(k) == big[k]
        assert b.get(b"\xff" * 61) is None and b.get(b"\x00") is None
        assert db.bucket(b"missing") is None
        assert db.freelist() == []
        # small buckets are inline (no page of their own), as bbolt stores them
        raw = dict((k, v) for k, v, _ in db.root().items())
        assert BUCKET_HEADER.unpack_from(raw[b"inline"])[0] == 0
        assert BUCKET_HEADER.unpack_from(raw[b"big"])[0] != 0


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.binary(min_size=1, max_size=30),
                       st.one_of(st.binary(max_size=600),
                                 st.dictionaries(st.binary(min_size=1, max_size=10), st.binary(max_size=2000),
                                                 max_size=40)),
                       max_size=120),
       st.sampled_from([1024, 4096]))
def test_roundtrip_property(tmp_path_factory, items, page_size):
    path = tmp_path_factory.mktemp("p") / "db"
    write(path, {b"b": items}, page_size)
    with BoltFile(str(path)) as db:
        assert read(db.root()) == {b"b": items}
        for k, v in items.items():
            if not isinstance(v, dict):
                assert db.bucket(b"b").get(k) == v


def test_writer_refuses_unsorted_and_bad_keys(tmp_path):
    with open(tmp_path / "db", "w+b") as f:
        w = BoltWriter(f)
        with pytest.raises(ValueError, match="strictly increasing"):
            w.bucket([(b"b", b""), (b"a", b"")])
        with pytest.raises(ValueError, match="strictly increasing"):
            w.bucket([(b"a", b""), (b"a", b"")])
        with pytest.raises(ValueError, match="1 to 32768"):
            w.bucket([(b"", b"")])


def test_damage_is_reported_with_the_page(tmp_path):
    path = tmp_path / "db"
    write(path, {b"key": {b"%06d" % i: b"v" * 100 for i in range(2000)}})
    good = path.read_bytes()

    # a damaged meta page: the other one is used (bbolt's rule)
    one = bytearray(good)
    one[16 + 20] ^= 1
    p1 = tmp_path / "meta0"
    p1.write_bytes(bytes(one))
    with BoltFile(str(p1)) as db:
        assert db.meta.txid == 3 and len(read(db.root())[b"key"]) == 2000

    both = bytearray(one)
    both[4096 + 16 + 20] ^= 1
    p2 = tmp_path / "metas"
    p2.write_bytes(bytes(both))
    with pytest.raises(BoltError, match="not a usable bbolt file"):
        BoltFile(str(p2))

    # a leaf page claiming another id
    with BoltFile(str(path)) as db:
        leaf = next(pg for pg in range(3, db.meta.pgid)
                    if PAGE_HEADER.unpack_from(good, pg * 4096)[1] == LEAF_PAGE)
    bad = bytearray(good)
    struct.pack_into("<Q", bad, leaf * 4096, leaf + 1000)
    p3 = tmp_path / "page"
    p3.write_bytes(bytes(bad))
    with BoltFile(str(p3)) as db, pytest.raises(BoltError, match=f"page {leaf} says it is page {leaf + 1000}"):
        read(db.root())

    # cut short
    p4 = tmp_path / "cut"
    p4.write_bytes(good[: len(good) // 2])
    with pytest.raises(BoltError, match="truncated"):
        BoltFile(str(p4))

    p5 = tmp_path / "text"
    p5.write_bytes(b"hello world\n" * 400)
    with pytest.raises(BoltError, match="not a usable bbolt file"):
        BoltFile(str(p5))


def test_real_bbolt_finds_our_file_consistent(tmp_path):
    """etcdutl's snapshot status runs bbolt's own consistency check (every
    page reachable once, keys ordered across pages) before reading."""
    etcdutl = etcd_tool("etcdutl-3.6")
    rng = random.Random(3)
    keys = sorted({rng.randbytes(rng.randint(1, 60)) for _ in range(3000)})
    spec = {
        b"a": {k: rng.randbytes(rng.choice([0, 10, 3000, 9000])) for k in keys},
        b"empty": {},
        b"meta": {b"storageVersion": b"3.6.0"},
        b"nested": {b"inner": {b"x": b"1"}, b"z": b"2"},
    }
    path = tmp_path / "db"
    size = write(path, spec)
    r = subprocess.run([etcdutl, "snapshot", "status", str(path), "-w", "json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["totalSize"] == size and st["version"] == "3.6.0"
