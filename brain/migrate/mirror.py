"""`brain mirror`: a brain data directory that follows a running etcd,
revision for revision, until the cutover.

1. Copy: etcd's Maintenance Snapshot (its whole database: every retained
   revision, the leases, the compaction revision) is imported exactly as
   `brain import` does, into a new data directory at etcd's revision R.
2. Follow: a Watch of every key from R + 1.  Each etcd revision's events
   become one revision of brain's journal at the same number (a Txn's
   several events stay one revision), applied through
   Engine.submit_effects; a gap in the revision sequence stops the mirror.
   Watch does not report leases, so a poller lists etcd's leases every
   `lease_poll` seconds and journals grants (ID, granted TTL) and revokes;
   a put carrying a lease the mirror has not seen yet fetches it first, so
   every key is attached to its lease.  The compaction revision is probed
   every `compaction_poll` seconds and journaled once brain has reached it.
   The mirror's engine never expires leases itself: the source decides.
3. Stop (SIGTERM/SIGINT): the mirror drains, i.e. applies up to etcd's
   revision at that moment (so, with writers stopped, exactly etcd's last
   revision), takes the leases and compaction once more, checkpoints and
   exits; `brain serve` on the directory then continues from there.

Lag is reported as revisions (etcd's newest known revision minus the
applied one) and seconds (how long ago etcd reached the oldest revision not
applied yet), in progress lines and as Prometheus metrics.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass

from brain.migrate.etcd_import import ImportResult, import_etcd
from brain.migrate.source import Source, SourceError
from brain.mvcc.codec import BatchEncoder
from brain.mvcc.requests import EVENT_PUT
from brain.progress import Progress, human_seconds


MAX_IN_FLIGHT = 256  # journal payloads submitted and not yet durable


class MirrorError(Exception):
    """The mirror cannot go on (the message says why and what to do)."""


@dataclass(frozen=True)
class MirrorStatistics:
    phase: str  # copying, following, draining, stopped
    source_revision: int
    applied_revision: int
    lag_revisions: int
    lag_seconds: float
    revisions_applied: int
    events_applied: int
    leases: int
    leases_granted: int
    leases_revoked: int
    compact_revision: int
    started_revision: int


class Mirror:
    def __init__(self, client: Source, data_dir: str, *, boundaries: list[bytes], name: str = "default",
                 replace: bool = False, out=None, interval: float = 5.0, lease_poll: float = 1.0,
                 compaction_poll: float = 5.0, engine_options: dict | None = None) -> None:
        self.client = client
        self.data_dir = os.path.abspath(data_dir)
        self.boundaries = list(boundaries)
        self.name = name
        self.replace = replace
        self.out = out or (lambda line: print(line, flush=True))
        self.interval = interval
        self.lease_poll = lease_poll
        self.compaction_poll = compaction_poll
        self.engine_options = dict(engine_options or {})
        self.engine = None
        self.phase = "copying"
        self._lock = threading.Lock()
        self._known_leases: set[int] = set()
        self._in_flight: deque = deque()  # (last revision, future)
        self._seen: deque = deque()  # (etcd revision, monotonic time it was seen)
        self._next_rev = 0
        self.started_revision = 0
        self.applied_revision = 0
        self.source_revision = 0
        self.compact_revision = -1
        self.revisions_applied = 0
        self.events_applied = 0
        self.leases_granted = 0
        self.leases_revoked = 0
        self._failure: BaseException | None = None
        self._follow_started = time.monotonic()
        self._target: int | None = None

    # ------------------------------------------------------------------
    # 1. the copy

    def copy(self) -> ImportResult:
        """Fetch etcd's snapshot and import it into the data directory."""
        parent = os.path.dirname(self.data_dir)
        os.makedirs(parent, exist_ok=True)
        download = Progress("mirror: fetching etcd's snapshot", unit=None, out=self.out)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".brain-mirror-", suffix=".snap") as f:

            def fetched(done: int, total: int) -> None:
                download.total_bytes = total
                download.update(nbytes=done)

            self.client.snapshot(f, fetched)
            f.flush()
            download.done()
            res = import_etcd(f.name, self.data_dir, boundaries=self.boundaries, name=self.name,
                              replace=self.replace, out=self.out, interval=self.interval)
        self.started_revision = self.applied_revision = self.source_revision = res.revision
        self.compact_revision = res.compact_revision
        self._next_rev = res.revision + 1
        return res

    # ------------------------------------------------------------------
    # 2. following

    def open_engine(self):
        from brain.engine import Engine, EngineConfig

        cfg = EngineConfig(self.data_dir, name=self.name, shards=len(self.boundaries) + 1,
                           shard_boundaries=self.boundaries, lease_expiry=False, **self.engine_options)
        self.engine = Engine.open(cfg)
        if self.engine.committed_rev != self.applied_revision:
            raise MirrorError(f"{self.data_dir} opened at revision {self.engine.committed_rev}, "
                              f"expected {self.applied_revision}")
        self._known_leases = {lease_id for lease_id, _ttl in self.engine.history().leases()}
        return self.engine

    def _submit(self, payload: bytes, last_rev: int | None) -> None:
        fut = self.engine.submit_effects(payload)
        self._in_flight.append((last_rev, fut))
        self._settle(block=len(self._in_flight) > MAX_IN_FLIGHT)

    def _settle(self, block: bool = False) -> None:
        """Account for durable payloads (they complete in order)."""
        while self._in_flight and (block or self._in_flight[0][1].done()):
            last_rev, fut = self._in_flight.popleft()
            fut.result()  # an engine failure stops the mirror here
            block = False
            if last_rev is not None:
                self.applied_revision = last_rev
                now_applied = last_rev
                while self._seen and self._seen[0][0] <= now_applied:
                    self._seen.popleft()

    def _wait_all(self) -> None:
        while self._in_flight:
            self._settle(block=True)

    def _grant_unknown(self, enc: BatchEncoder, lease_id: int) -> None:
        """A put carries a lease not granted in brain yet: fetch it now, so
        the key is attached to it (a lease already gone at the source needs
        nothing: its keys' deletes are on their way)."""
        with self._lock:
            if lease_id in self._known_leases:
                return
        got = self.client.lease_ttl(lease_id)
        if got is None:
            return
        with self._lock:
            if lease_id in self._known_leases:
                return
            self._known_leases.add(lease_id)
            self.leases_granted += 1
        enc.lease_grant(lease_id, got[0])

    def apply(self, batch) -> None:
        """Journal one watch response's events at etcd's revisions."""
        now = time.monotonic()
        if batch.revision > self.source_revision:
            self.source_revision = batch.revision
            self._seen.append((batch.revision, now))
        if not batch.events:
            self._settle()
            return
        enc = BatchEncoder()
        for ev in batch.events:
            if ev.type == EVENT_PUT and ev.kv.lease:
                self._grant_unknown(enc, ev.kv.lease)
        current = 0
        revisions = 0
        for ev in batch.events:
            rev = ev.kv.mod_revision
            if rev != current:
                if rev != self._next_rev:
                    raise MirrorError(f"etcd sent revision {rev} where {self._next_rev} was expected; "
                                      f"the mirror cannot follow a gap (start it again with --replace)")
                enc.begin_revision(rev)
                current = rev
                self._next_rev = rev + 1
                revisions += 1
            if ev.type == EVENT_PUT:
                enc.put(ev.kv.key, ev.kv.value, ev.kv.lease)
            else:
                enc.delete(ev.kv.key)
        self._submit(enc.finish(), current)
        self.revisions_applied += revisions
        self.events_applied += len(batch.events)
        if current > self.source_revision:
            self.source_revision = current

    def poll_leases(self) -> None:
        """Journal the grants and revokes etcd made since the last poll."""
        ids = set(self.client.leases())
        with self._lock:
            new = ids - self._known_leases
            gone = self._known_leases - ids
        enc = BatchEncoder()
        granted = []
        for lease_id in sorted(new):
            got = self.client.lease_ttl(lease_id)
            if got is not None:
                granted.append((lease_id, got[0]))
        with self._lock:
            for lease_id, ttl in granted:
                if lease_id not in self._known_leases:
                    self._known_leases.add(lease_id)
                    enc.lease_grant(lease_id, ttl)
                    self.leases_granted += 1
            for lease_id in sorted(gone):
                if lease_id in self._known_leases:
                    self._known_leases.discard(lease_id)
                    enc.lease_revoke(lease_id)
                    self.leases_revoked += 1
        payload = enc.finish()
        if payload:
            self.engine.submit_effects(payload).result()

    def poll_compaction(self) -> None:
        """Journal etcd's compaction once brain has reached its revision."""
        c = self.client.compact_revision(max(self.compact_revision, 0))
        if c > self.compact_revision and c <= self.engine.committed_rev:
            enc = BatchEncoder()
            enc.compact(c)
            self.engine.submit_effects(enc.finish()).result()
            self.compact_revision = c

    def _poller(self, stop: threading.Event) -> None:
        """Leases every lease_poll seconds, compaction every compaction_poll.
        etcd being unreachable for a while is reported once and retried (the
        watch notices it too); an engine failure stops the mirror."""
        next_compaction = 0.0
        unreachable = False
        while not stop.wait(self.lease_poll):
            try:
                self.poll_leases()
                if time.monotonic() >= next_compaction:
                    self.poll_compaction()
                    next_compaction = time.monotonic() + self.compaction_poll
                unreachable = False
            except SourceError as e:
                if not unreachable:
                    self.out(f"mirror: polling etcd's leases failed ({e}); retrying")
                unreachable = True
            except Exception as e:  # noqa: BLE001 - reported by follow()
                self._failure = e
                return

    def follow(self, stop: threading.Event, drain_timeout: float = 120.0) -> None:
        """Apply etcd's changes until `stop` is set, then drain to etcd's
        revision at that moment.  A watch that breaks (etcd restarting, a
        network hiccup) is opened again from the next revision."""
        self.phase = "following"
        self._follow_started = time.monotonic()
        poll_stop = threading.Event()
        poller = threading.Thread(target=self._poller, args=(poll_stop,), name="brain-mirror-poll", daemon=True)
        poller.start()
        self._target = None
        self._deadline = 0.0
        self._next_line = time.monotonic() + self.interval
        self._caught_up_said = False
        backoff = 0.2
        try:
            while True:
                watch = self.client.watch_all(self._next_rev)
                try:
                    if self._consume(watch, stop, drain_timeout):
                        break
                except SourceError as e:
                    if stop.is_set():
                        raise MirrorError(f"stopped while etcd is unreachable ({e}); the data directory holds "
                                          f"etcd's history up to revision {self.applied_revision}") from None
                    self.out(f"mirror: {e}; watching again from revision {self._next_rev} in {backoff:.1f}s")
                    stop.wait(backoff)
                    backoff = min(5.0, backoff * 2)
                    continue
                finally:
                    watch.close()
                backoff = 0.2
        finally:
            poll_stop.set()
            poller.join(10)
        self._wait_all()
        # the last grants, revokes and compaction before handing over
        self.poll_leases()
        self.poll_compaction()
        self.phase = "stopped"

    def _consume(self, watch, stop: threading.Event, drain_timeout: float) -> bool:
        """Apply batches from `watch`; True once drained after `stop`."""
        for batch in watch:
            if batch.compacted:
                raise MirrorError(f"etcd compacted revision {batch.compacted} before the mirror read "
                                  f"revision {self._next_rev}; start the mirror again (with --replace)")
            self.apply(batch)
            if self._failure is not None:
                raise MirrorError(f"polling etcd failed: {self._failure}")
            now = time.monotonic()
            if stop.is_set() and self._target is None:
                self.phase = "draining"
                self._target = self.client.revision()
                self._deadline = now + drain_timeout
                self.out(f"mirror: stopping: draining to etcd's revision {self._target}")
            if self._target is not None:
                self._settle()
                if self._next_rev > self._target:
                    return True
                if now > self._deadline:
                    raise MirrorError(f"could not reach etcd's revision {self._target} within {drain_timeout:.0f}s "
                                      f"(at {self._next_rev - 1})")
            if now >= self._next_line:
                self._next_line = now + self.interval
                self.out(self.describe())
            elif not self._caught_up_said and self._next_rev > self.source_revision:
                self._caught_up_said = True
                self.out(self.describe())
        return False

    # ------------------------------------------------------------------
    # reporting

    def lag(self) -> tuple[int, float]:
        behind = max(0, self.source_revision - self.applied_revision)
        seconds = time.monotonic() - self._seen[0][1] if self._seen and behind else 0.0
        return behind, seconds

    def describe(self) -> str:
        behind, seconds = self.lag()
        done = self.applied_revision - self.started_revision
        line = (f"mirror: {self.phase}: revision {self.applied_revision:,} of etcd's {self.source_revision:,} "
                f"({behind:,} behind, {seconds:.3f}s); {done:,} revisions, {self.events_applied:,} events applied, "
                f"{len(self._known_leases):,} leases")
        if behind and done:
            rate = self.revisions_applied / max(1e-9, time.monotonic() - self._follow_started)
            if rate > 0:
                line += f", {rate:,.0f} revisions/s, {human_seconds(behind / rate)} left"
        return line

    def statistics(self) -> MirrorStatistics:
        behind, seconds = self.lag()
        with self._lock:
            leases = len(self._known_leases)
        return MirrorStatistics(self.phase, self.source_revision, self.applied_revision, behind, seconds,
                                self.revisions_applied, self.events_applied, leases, self.leases_granted,
                                self.leases_revoked, self.compact_revision, self.started_revision)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
