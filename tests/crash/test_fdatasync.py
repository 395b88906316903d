"""Nothing is acknowledged before its journal record is fdatasync'ed, checked
from outside a running `brain serve` whose data dir is on a real disk.

kill -9 keeps the page cache (and on /dev/shm fdatasync costs nothing), so an
engine that answered before syncing would pass every kill -9 test.  Here the
fdatasync call itself is made to fail or to stall, and what a writer and a
reader see is checked:

* fail (libfiu's POSIX preload: the server runs under `fiu-run -x`, and
  `fiu-ctrl` enables `posix/io/sync/fdatasync` with EIO or ENOSPC while it
  serves): every write of the failed batch and after it gets etcd's error
  UNAVAILABLE "etcdserver: server stopped" (for ENOSPC too: freeing space
  would not make the lost pages durable, so it is not "database space
  exceeded"), never success; a reader does
  not see it (revision unchanged), a watch gets no event for it (a progress
  request is answered at the old revision); writes stay refused after
  fdatasync works again (fail-stop: after a failed fdatasync the kernel may
  have dropped the pages, so the journal is not trusted until reopened) while
  reads go on and Status and /health report the failure; after a restart
  every acknowledged write is there, the refused ones are either absent or
  exactly as sent (a refused write is indeterminate, as in etcd), and writes
  are taken again.
* stall (libfiu has no delay action, so strace's syscall tampering attached
  to the running server: `-e inject=fdatasync:delay_enter=3s` holds only the
  thread that calls fdatasync, then runs the real call): while it is held,
  the write gets no answer and a reader does not see it, though reads are
  answered; once fdatasync returns, the write succeeds at the next revision.
* fail at a rollover (the journal's segment filled to its last bytes, then
  a write that needs the preallocated next one, whose header is synced
  before it becomes a segment): the same error and the same stop, not the
  rebuild a journal out of space gets.

An engine that answered before fdatasync returned fails both: its client gets
success (or gets it at once during the stall), and a reader sees the write.
Needs fiu-utils and strace (Debian packages; `make deps-system`): a failure
under CI, a listed skip elsewhere.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from brain.api.pb.etcdserverpb import rpc_pb2_grpc
from brain.journal import parse_segment_name
from brain.journal.segment import scan_segment
from tests.support.servers import free_port, http_get, kv_stub, require_brain, require_tool, start_brain
from tests.support.strace import traced_by

pytestmark = pytest.mark.timeout(300)

# No checkpoint while a test runs: lmdb's own fdatasyncs stay out of the way.
QUIET_CHECKPOINTS = ["--checkpoint-interval", "1h", "--checkpoint-journal-bytes", str(1 << 30),
                     "--checkpoint-memtable-records", "10000000"]
STALL_S = 3.0


def fiu_ctrl(prefix: Path, pid: int, command: str) -> None:
    r = subprocess.run(["fiu-ctrl", "-f", str(prefix), "-c", command, str(pid)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0 and "error" not in (r.stdout + r.stderr).lower(), (command, r.stdout, r.stderr)


def put(kv, key: bytes, value: bytes, timeout: float = 10) -> int:
    return kv.Put(pb.PutRequest(key=key, value=value), timeout=timeout).header.revision


class WatchStream:
    """One Watch stream with requests fed from a queue."""

    def __init__(self, channel, key: bytes, range_end: bytes) -> None:
        self.requests: queue.Queue = queue.Queue()
        self.requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key, range_end=range_end)))
        self.responses = rpc_pb2_grpc.WatchStub(channel).Watch(iter(self.requests.get, None), timeout=120)
        assert next(self.responses).created

    def progress(self):
        """The next response after a RequestProgress (brain never lets a
        progress response overtake an event, so events come first)."""
        self.requests.put(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))
        return next(self.responses)

    def close(self) -> None:
        self.requests.put(None)
        self.responses.cancel()


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
def test_failed_fdatasync_acknowledges_nothing_and_stops_writes(err, tmp_path):
    require_brain()
    require_tool("fiu-run", "fiu-utils")
    require_tool("fiu-ctrl", "fiu-utils")
    ctrl = tmp_path / "fiu-ctrl"
    metrics = f"http://127.0.0.1:{free_port()}"
    srv = start_brain(1, [*QUIET_CHECKPOINTS, "--listen-metrics-urls", metrics], on_disk=True,
                      wrapper=["fiu-run", "-x", "-f", str(ctrl)])
    code, text = grpc.StatusCode.UNAVAILABLE, "etcdserver: server stopped"
    try:
        pid = srv.proc.pid
        with kv_stub(srv.endpoint) as st:
            acked = {b"f/%02d" % i: (b"v%d" % i, put(st.kv, b"f/%02d" % i, b"v%d" % i)) for i in range(10)}
            before = max(rev for _, rev in acked.values())
            watch = WatchStream(st.channel, b"f/", b"f0")
            try:
                fiu_ctrl(ctrl, pid, f"enable name=posix/io/sync/fdatasync,failinfo={err}")
                # A batch of concurrent writes, then single ones: none may succeed.
                calls = [st.kv.Put.future(pb.PutRequest(key=b"f/x%02d" % i, value=b"lost?")) for i in range(20)]
                outcomes = []
                for c in calls:
                    try:
                        outcomes.append(("ok", c.result(timeout=30).header.revision))
                    except grpc.RpcError as e:
                        outcomes.append((e.code(), e.details()))
                assert set(outcomes) == {(code, text)}, f"writes during a failing fdatasync: {outcomes}"
                # the reader: nothing new, at the old revision
                r = st.kv.Range(pb.RangeRequest(key=b"f/", range_end=b"f0"), timeout=10)
                assert r.header.revision == before and len(r.kvs) == 10, (r.header.revision, before, len(r.kvs))
                # the watcher: no event; progress at the old revision
                p = watch.progress()
                assert not p.events and p.header.revision == before, p
                # fdatasync works again, but the engine stays stopped for writes
                fiu_ctrl(ctrl, pid, "disable name=posix/io/sync/fdatasync")
                with pytest.raises(grpc.RpcError) as ei:
                    put(st.kv, b"f/after", b"v")
                assert (ei.value.code(), ei.value.details()) == (code, text)
                # reads go on; Status and /health say why writes are refused
                got = st.kv.Range(pb.RangeRequest(key=b"f/00"), timeout=10)
                assert got.kvs[0].value == b"v0" and got.header.revision == before
                status = st.maintenance.Status(pb.StatusRequest(), timeout=10)
                assert any("refuses writes until restarted" in e for e in status.errors), status.errors
                hcode, body = http_get(metrics + "/health")
                assert hcode == 503 and json.loads(body)["health"] == "false", (hcode, body)
                assert "ENGINE FAILED" in json.loads(body)["reason"], body
            finally:
                watch.close()
        assert "journal write failed" in srv.log_tail()
        srv.restart()
        with kv_stub(srv.endpoint) as st:
            for key, (value, rev) in acked.items():
                r = st.kv.Range(pb.RangeRequest(key=key, revision=rev), timeout=10)
                assert [(kv.value, kv.mod_revision) for kv in r.kvs] == [(value, rev)], key
            r = st.kv.Range(pb.RangeRequest(key=b"f/x", range_end=b"f/y"), timeout=10)
            # refused writes are indeterminate: absent, or exactly as sent and after every acknowledged one
            assert all(kv.value == b"lost?" and kv.mod_revision > before for kv in r.kvs), r.kvs
            assert st.kv.Range(pb.RangeRequest(key=b"f/after"), timeout=10).count == 0
            head = r.header.revision
            assert put(st.kv, b"f/restarted", b"v") == head + 1
    finally:
        srv.cleanup()


def test_stalled_fdatasync_holds_the_answer(tmp_path):
    require_brain()
    require_tool("strace", "strace")
    srv = start_brain(1, QUIET_CHECKPOINTS, on_disk=True)
    tracer = None
    try:
        with kv_stub(srv.endpoint) as st:
            before = put(st.kv, b"s/0", b"v0")
            log = tmp_path / "strace.out"
            tracer = subprocess.Popen(
                ["strace", "-f", "-qq", "-p", str(srv.proc.pid), "-e", "trace=fdatasync",
                 "-e", f"inject=fdatasync:delay_enter={int(STALL_S * 1000)}ms", "-o", str(log)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + 30
            while not traced_by(srv.proc.pid, tracer.pid):
                assert tracer.poll() is None, f"strace exited: {tracer.stderr.read()}"
                assert time.monotonic() < deadline, "strace did not attach to every thread"
                time.sleep(0.05)
            t0 = time.monotonic()
            call = st.kv.Put.future(pb.PutRequest(key=b"s/1", value=b"v1"), timeout=60)
            # While fdatasync is held: no answer to the writer, nothing new for a reader,
            # whose reads are answered meanwhile.
            looks = 0
            while time.monotonic() - t0 < STALL_S * 0.6:
                r0 = time.monotonic()
                r = st.kv.Range(pb.RangeRequest(key=b"s/", range_end=b"s0"), timeout=10)
                assert time.monotonic() - r0 < STALL_S * 0.5, "a read waited for the stalled fdatasync"
                assert r.header.revision == before and [kv.key for kv in r.kvs] == [b"s/0"], r
                assert not call.done(), f"the write was answered {time.monotonic() - t0:.2f}s into the stall"
                looks += 1
                time.sleep(0.1)
            assert looks >= 3
            rev = call.result(timeout=30).header.revision
            took = time.monotonic() - t0
            assert rev == before + 1
            assert took >= STALL_S * 0.9, f"answered after {took:.2f}s, before the {STALL_S}s stall ended"
            r = st.kv.Range(pb.RangeRequest(key=b"s/1"), timeout=10)
            assert [(kv.value, kv.mod_revision) for kv in r.kvs] == [(b"v1", rev)]
            tracer.send_signal(signal.SIGTERM)  # strace detaches and lets the server go on
            tracer.wait(30)
            assert "(DELAYED)" in log.read_text(), log.read_text()[-2000:]
            tracer = None
            t1 = time.monotonic()
            assert put(st.kv, b"s/2", b"v2") == rev + 1
            assert time.monotonic() - t1 < STALL_S, "writes still stalled after strace detached"
    finally:
        if tracer is not None and tracer.poll() is None:
            tracer.kill()
            tracer.wait(30)
        srv.cleanup()


def _segment_room(journal_dir: Path) -> int:
    """Bytes left in the journal's active segment (its size less its frames)."""
    last = sorted(p for p in journal_dir.iterdir() if parse_segment_name(p.name) is not None)[-1]
    data = last.read_bytes()
    return len(data) - scan_segment(data, str(last), is_last=True).end


def test_failed_fdatasync_at_a_rollover_stops_writes(tmp_path):
    """A rollover syncs what it hands over (the segment it completes, the
    preallocated next one's header): a failure there is a failed fdatasync
    too, not a full disk: etcd's "etcdserver: server stopped" until a
    restart, never success, and not the rebuild a full journal gets."""
    require_brain()
    require_tool("fiu-run", "fiu-utils")
    require_tool("fiu-ctrl", "fiu-utils")
    ctrl = tmp_path / "fiu-ctrl"
    segment = 64 << 10
    srv = start_brain(1, [*QUIET_CHECKPOINTS, "--journal-segment-bytes", str(segment)], on_disk=True,
                      wrapper=["fiu-run", "-x", "-f", str(ctrl)])
    code, text = grpc.StatusCode.UNAVAILABLE, "etcdserver: server stopped"
    try:
        journal = srv.data_dir / "journal"
        acked = {}
        with kv_stub(srv.endpoint) as st:
            n = 0
            while (room := _segment_room(journal)) > 400:  # the active segment filled to its last bytes
                key, value = b"r/%03d" % n, os.urandom(min(room - 300, 8000) // 2).hex().encode()
                acked[key] = (value, put(st.kv, key, value))
                n += 1
            segments = len([p for p in journal.iterdir() if p.name.endswith(".journal")])
            fiu_ctrl(ctrl, srv.proc.pid, f"enable name=posix/io/sync/fdatasync,failinfo={errno.EIO}")
            with pytest.raises(grpc.RpcError) as ei:
                put(st.kv, b"r/rollover", b"x" * 1000)  # does not fit: the next segment
            assert (ei.value.code(), ei.value.details()) == (code, text)
            fiu_ctrl(ctrl, srv.proc.pid, "disable name=posix/io/sync/fdatasync")
            with pytest.raises(grpc.RpcError) as ei:
                put(st.kv, b"r/after", b"v")
            assert (ei.value.code(), ei.value.details()) == (code, text)
            r = st.kv.Range(pb.RangeRequest(key=b"r/", range_end=b"r0"), timeout=10)
            assert len(r.kvs) == len(acked), "reads go on, and do not see the refused write"
        log = srv.log_tail()
        assert "journal write failed" in log and "rebuilding the store" not in log, log
        assert segments == 1
        srv.restart()
        with kv_stub(srv.endpoint) as st:
            for key, (value, rev) in acked.items():
                r = st.kv.Range(pb.RangeRequest(key=key), timeout=10)
                assert [(kv.value, kv.mod_revision) for kv in r.kvs] == [(value, rev)], key
            r = st.kv.Range(pb.RangeRequest(key=b"r/rollover"), timeout=10)
            assert all(kv.value == b"x" * 1000 for kv in r.kvs), r.kvs  # indeterminate, as in etcd
            assert st.kv.Range(pb.RangeRequest(key=b"r/after"), timeout=10).count == 0
            put(st.kv, b"r/restarted", b"v")
    finally:
        srv.cleanup()
