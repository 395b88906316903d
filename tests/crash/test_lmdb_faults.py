"""The value store's writes failed while `brain serve` runs: a checkpoint
cut short at each of lmdb's steps, by strace attached to the server and
tampering with the syscalls on data.mdb (``-P``) alone.

lmdb commits in three steps: the data pages (``writev``, or ``pwrite64``
for a lone page), ``fdatasync``, then the meta page (``pwrite64`` on a
descriptor opened O_DSYNC).  Cases:

* pages, ENOSPC: the disk full as the file grows (writev and pwrite64);
* fdatasync, EIO: the data pages not written back;
* commit, ENOSPC and EIO: the meta page, the checkpoint's commit itself.
  lmdb then refuses every transaction, reads included (MDB_PANIC), until
  the environment is opened again.  To fail that one write and not a lone
  data page before it, a first strace stops the server (an injected
  SIGSTOP) at the checkpoint's fdatasync on data.mdb, and a second one,
  attached while it is stopped, fails every pwrite64 on data.mdb from
  there: the next is the meta page.

Checked, while the fault holds: the checkpoint failed; every value read
from the value store (keys checkpointed before) and every acknowledged
write are read back; for ENOSPC, the NOSPACE alarm is raised and puts are
refused with etcd's "etcdserver: mvcc: database space exceeded" while
deletes are taken; for EIO (the disk is not full) puts go on.  After
strace detaches and the operator disarms the alarm (`etcdctl alarm
disarm`): puts are taken and a later checkpoint succeeds, with no
restart; after a restart every acknowledged write is there and no refused
one.

Needs strace (`make deps-system`) and etcdctl: a failure under CI, a
listed skip elsewhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import grpc
import pytest

from brain.api.pb.etcdserverpb import rpc_pb2 as pb
from tests.crash.space_support import (
    ETCDCTL_ENV,
    NOSPACE,
    check_acked,
    checkpoints,
    etcdctl,
    etcdctl_command,
    member_id,
    refused_for_space,
    wait_for,
)
from tests.support.servers import free_port, require_brain, start_brain
from tests.support.strace import LmdbCommitFault, Strace

pytestmark = pytest.mark.timeout(180)

CHECKPOINT_EVERY = 32 << 10
ARGS = ["--checkpoint-journal-bytes", str(CHECKPOINT_EVERY), "--checkpoint-interval", "1h",
        "--checkpoint-memtable-records", "10000000", "--journal-segment-bytes", str(4 << 20)]
FAULTS = {  # syscalls failed, errno, whether the meta page's write is aimed at
    "pages-ENOSPC": ("writev,pwrite64", "ENOSPC", False),
    "fdatasync-EIO": ("fdatasync", "EIO", False),
    "commit-ENOSPC": ("pwrite64", "ENOSPC", True),
    "commit-EIO": ("pwrite64", "EIO", True),
}


# `make test-full` fails and heals the value store this many times on one
# server (BRAIN_DISK_CYCLES)
CYCLES = int(os.environ.get("BRAIN_DISK_CYCLES", "1"))


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_failed_checkpoint_write_and_back_without_a_restart(fault, tmp_path):
    require_brain()
    metrics = f"http://127.0.0.1:{free_port()}"
    srv = start_brain(1, [*ARGS, "--listen-metrics-urls", metrics])
    faults: list = []
    try:
        acked: dict[bytes, tuple[int, bytes]] = {}
        absent: list[bytes] = []
        with srv.stubs() as st:
            # values the next reads take from the value store, not from memory
            for i in range(40):
                key, value = b"before/%02d" % i, os.urandom(500).hex().encode()
                acked[key] = (st.kv.Put(pb.PutRequest(key=key, value=value), timeout=10).header.revision, value)
            wait_for("a checkpoint", lambda: checkpoints(metrics) >= 1, srv=srv)
            for n in range(CYCLES):
                _fail_and_heal(srv, st, metrics, fault, n, tmp_path, acked, absent, faults)
        assert srv.proc.poll() is None
        srv.restart()
        with srv.stubs() as st:
            check_acked(st, acked, absent)
            assert etcdctl(srv, "alarm", "list") == ""
    finally:
        for f in faults:
            f.detach()
        if srv.proc is not None and srv.proc.poll() is None:
            os.kill(srv.proc.pid, signal.SIGCONT)  # never leave it stopped
        srv.cleanup()


def _fail_and_heal(srv, st, metrics: str, fault: str, n: int, tmp_path, acked: dict, absent: list,
                   faults: list) -> None:
    """One round: a checkpoint failed by ``fault`` while puts go on, the
    fault held while the server is looked at, then gone (round ``n``'s keys
    have n in them); ``acked`` and ``absent`` are brought up to date."""
    syscalls, err, at_commit = FAULTS[fault]
    full = err == "ENOSPC"
    pid = srv.proc.pid
    data_mdb = str(srv.data_dir / "values" / "data.mdb")
    log = srv.log_path
    failed, reopened = log.read_text().count("checkpoint failed"), log.read_text().count("reopened the value store")
    done = checkpoints(metrics)
    if at_commit:
        fail = LmdbCommitFault(pid, data_mdb, err, tmp_path)
        fail.arm()
    else:
        fail = Strace(pid, ["-P", data_mdb, "-e", f"trace={syscalls}", "-e", f"inject={syscalls}:error={err}"],
                      tmp_path / "fail.out")
    faults.append(fail)
    # puts until a checkpoint starts and fails
    for i in range(200):
        key, value = b"during/%d/%03d" % (n, i), os.urandom(750).hex().encode()
        call = st.kv.Put.future(pb.PutRequest(key=key, value=value), timeout=60)
        while not call.done() and not (at_commit and fail.stopped()):
            time.sleep(0.01)
        if at_commit and fail.stopped():  # in the checkpoint's commit
            fail.fire()
            at_commit = False
        try:
            acked[key] = (call.result(timeout=30).header.revision, value)
        except grpc.RpcError as e:
            assert full and e.details() == NOSPACE, (e.code(), e.details(), srv.log_tail())
            absent.append(key)
        if log.read_text().count("checkpoint failed") > failed:
            break
        time.sleep(0.02)
    assert log.read_text().count("checkpoint failed") > failed, srv.log_tail()
    if FAULTS[fault][2]:
        assert fail.failed_the_meta_page(), fail.tracer.output()[-3000:]
    else:
        assert "(INJECTED)" in fail.output(), fail.output()[-3000:]

    # the fault holds: reads go on, from the value store too
    check_acked(st, acked, absent)
    if FAULTS[fault][2]:  # lmdb was in MDB_PANIC
        assert log.read_text().count("reopened the value store") > reopened, srv.log_tail()
    me = member_id(st)
    if full:
        assert etcdctl(srv, "alarm", "list") == f"memberID:{me} alarm:NOSPACE \n"
        refused = b"refused/%d" % n
        refused_for_space(lambda: st.kv.Put(pb.PutRequest(key=refused, value=b"x"), timeout=10))
        deleted = b"before/%02d" % n
        st.kv.DeleteRange(pb.DeleteRangeRequest(key=deleted), timeout=10)
        del acked[deleted]
        absent += [refused, deleted]
        # disarmed too early: the alarm cannot be stored, and stays
        r = subprocess.run(etcdctl_command(srv, "alarm", "disarm"), env=ETCDCTL_ENV,
                           capture_output=True, text=True, timeout=30)
        assert (r.returncode, r.stderr.strip().splitlines()[-1]) == (1, f"Error: {NOSPACE}"), r
        assert etcdctl(srv, "alarm", "list") == f"memberID:{me} alarm:NOSPACE \n"
    else:  # a disk that is not full: no alarm, writes go on
        assert etcdctl(srv, "alarm", "list") == ""
        key = b"still/%d" % n
        acked[key] = (st.kv.Put(pb.PutRequest(key=key, value=b"x"), timeout=10).header.revision, b"x")
    check_acked(st, acked, absent)

    # the fault ends: the checkpoint it failed is written at its next try
    # (one under way meanwhile may still fail and raise the alarm again: the
    # operator disarms after); no restart
    fail.detach()
    wait_for("a checkpoint after the fault", lambda: checkpoints(metrics) > done, timeout=45, srv=srv)
    if full:
        assert etcdctl(srv, "alarm", "disarm") == f"memberID:{me} alarm:NOSPACE \n"
    assert etcdctl(srv, "alarm", "list") == ""
    for i in range(20):
        key = b"after/%d/%02d" % (n, i)
        acked[key] = (st.kv.Put(pb.PutRequest(key=key, value=b"y" * 1000), timeout=10).header.revision,
                      b"y" * 1000)
    check_acked(st, acked, absent)
    # a reopen leaves lmdb's files open once: data.mdb twice (its meta page
    # goes through a descriptor of its own), lock.mdb once
    assert open_files(pid, data_mdb) == 2 and open_files(pid, data_mdb[:-len("data.mdb")] + "lock.mdb") == 1


def open_files(pid: int, path: str) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}") == path
        except OSError:
            pass  # closed meanwhile
    return n


def test_reads_go_on_after_an_alarms_commit_failed(tmp_path):
    """An alarm's write (a client raising one) whose commit fails leaves
    lmdb in MDB_PANIC with no checkpoint to come: the next read of a value
    in the value store reopens it and is answered; the client that raised
    the alarm got etcd's NOSPACE error and the alarm is not raised."""
    require_brain()
    metrics = f"http://127.0.0.1:{free_port()}"
    srv = start_brain(1, [*ARGS, "--listen-metrics-urls", metrics])
    pid = srv.proc.pid
    commit = LmdbCommitFault(pid, str(srv.data_dir / "values" / "data.mdb"), "ENOSPC", tmp_path)
    try:
        acked: dict[bytes, tuple[int, bytes]] = {}
        with srv.stubs() as st:
            for i in range(40):
                key, value = b"before/%02d" % i, os.urandom(500).hex().encode()
                acked[key] = (st.kv.Put(pb.PutRequest(key=key, value=value), timeout=10).header.revision, value)
            # the first ones are read from the value store from now on; no
            # checkpoint is due before 32 KiB more are journaled
            wait_for("a checkpoint", lambda: checkpoints(metrics) >= 1, srv=srv)
            commit.arm()
            raise_one = pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=1, alarm=pb.NOSPACE)
            call = st.maintenance.Alarm.future(raise_one, timeout=60)
            wait_for("the alarm's commit", lambda: call.done() or commit.stopped(), srv=srv)
            assert not call.done(), call.result()
            commit.fire()
            with pytest.raises(grpc.RpcError) as ei:
                call.result(timeout=30)
            assert (ei.value.code(), ei.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, NOSPACE)
            assert commit.failed_the_meta_page(), commit.tracer.output()[-3000:]
            commit.detach()
            check_acked(st, acked)  # from the value store, reopened
            assert "reopened the value store after MDB_PANIC" in srv.log_tail(), srv.log_tail()
            assert etcdctl(srv, "alarm", "list") == ""
            st.maintenance.Alarm(raise_one, timeout=10)  # stored this time
            assert etcdctl(srv, "alarm", "list") == "memberID:1 alarm:NOSPACE \n"
            assert etcdctl(srv, "alarm", "disarm") == "memberID:1 alarm:NOSPACE \n"
            rev = st.kv.Put(pb.PutRequest(key=b"after", value=b"y"), timeout=10).header.revision
            acked[b"after"] = (rev, b"y")
        srv.restart()
        with srv.stubs() as st:
            check_acked(st, acked)
    finally:
        commit.detach()
        if srv.proc is not None and srv.proc.poll() is None:
            os.kill(srv.proc.pid, signal.SIGCONT)
        srv.cleanup()
