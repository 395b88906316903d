"""A server's journal damaged between runs: a torn tail is repaired and
startup continues; corruption before the tail stops startup with an error
naming the file and offset, and nothing is dropped silently."""

from __future__ import annotations

import glob
import os
import struct
import subprocess
import sys

import grpc

from brain.api.pb.etcdserverpb import rpc_pb2
from tests.support.servers import REPO_ROOT, kv_stub, require_brain, start_brain


def _segment(srv) -> str:
    (path,) = sorted(glob.glob(str(srv.data_dir / "journal" / "*.journal")))[-1:]
    return path


def _data_end(path: str) -> int:
    """Offset just past the last frame (frames: u32 length, u32 crc, payload, pad to 8)."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos + 8 <= len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        if length == 0:
            break
        pos += 8 + ((length + 7) & ~7)
    return pos


def _write_some(srv, n: int) -> list[tuple[bytes, int]]:
    out = []
    with kv_stub(srv.endpoint) as st:
        for i in range(n):
            r = st.kv.Put(rpc_pb2.PutRequest(key=b"k%03d" % i, value=b"v%d" % i), timeout=10)
            out.append((b"k%03d" % i, r.header.revision))
    return out


def test_torn_tail_is_repaired():
    require_brain()
    srv = start_brain(extra_args=["--checkpoint-interval", "1h"])
    try:
        acked = _write_some(srv, 50)
        srv.kill9()
        seg = _segment(srv)
        end = _data_end(seg)
        with open(seg, "r+b") as f:  # half a frame that never got acknowledged
            f.seek(end)
            f.write(struct.pack("<II", 4096, 0xDEADBEEF) + b"\x07" * 100)
        srv.start()
        with kv_stub(srv.endpoint) as st:
            for key, rev in acked:
                kv = st.kv.Range(rpc_pb2.RangeRequest(key=key), timeout=10).kvs[0]
                assert kv.mod_revision == rev
            st.kv.Put(rpc_pb2.PutRequest(key=b"after", value=b"x"), timeout=10)
    finally:
        srv.cleanup()


def test_mid_log_corruption_stops_startup_naming_file_and_offset():
    require_brain()
    srv = start_brain(extra_args=["--checkpoint-interval", "1h"])
    try:
        _write_some(srv, 50)
        srv.kill9()
        seg = _segment(srv)
        end = _data_end(seg)
        with open(seg, "r+b") as f:  # flip one byte in the middle of the log
            f.seek(end // 2)
            b = f.read(1)
            f.seek(end // 2)
            f.write(bytes([b[0] ^ 0x55]))
        proc = subprocess.run(
            [sys.executable, "-m", "brain", "serve", "--data-dir", str(srv.data_dir),
             "--listen-client-urls", srv.client_url, "--shards", "1"],
            cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0
        out = proc.stdout + proc.stderr
        assert os.path.basename(seg) in out and "offset" in out, out[-2000:]
    finally:
        srv.cleanup()
