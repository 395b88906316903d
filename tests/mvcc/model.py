"""A deliberately naive reference model of etcd's MVCC semantics.

It keeps a full copy of the keyspace at every revision, so every answer is a
dictionary lookup: slow and obviously right, the yardstick for the store.
"""

from __future__ import annotations

from brain.mvcc import errors
from brain.mvcc.requests import KeyValue


class Model:
    def __init__(self) -> None:
        self.rev = 1
        self.states: dict[int, dict[bytes, KeyValue]] = {1: {}}
        self.compact_rev = -1

    def state(self, rev: int = 0) -> dict[bytes, KeyValue]:
        return self.states[rev or self.rev]

    @staticmethod
    def in_range(key: bytes, start: bytes, end: bytes) -> bool:
        if not end:
            return key == start
        if end == b"\x00":
            return key >= start
        return start <= key < end

    def read_rev(self, rev: int) -> int:
        if rev > self.rev:
            raise errors.ErrFutureRev.fresh()
        if rev <= 0:
            rev = self.rev
        if rev < self.compact_rev:
            raise errors.ErrCompacted.fresh()
        return rev

    def range(self, start: bytes, end: bytes, rev: int = 0, limit: int = 0):
        rev = self.read_rev(rev)
        kvs = sorted((kv for k, kv in self.state(rev).items() if self.in_range(k, start, end)), key=lambda kv: kv.key)
        count = len(kvs)
        more = bool(limit) and count > limit
        if limit:
            kvs = kvs[:limit]
        return kvs, count, more

    def begin(self) -> "ModelWrite":
        return ModelWrite(self)

    def compact(self, rev: int) -> None:
        if rev <= self.compact_rev:
            raise errors.ErrCompacted.fresh()
        if rev > self.rev:
            raise errors.ErrFutureRev.fresh()
        self.compact_rev = rev


class ModelWrite:
    def __init__(self, model: Model) -> None:
        self.model = model
        self.st = dict(model.state())
        self.changed = False

    @property
    def rev(self) -> int:
        return self.model.rev + 1

    def put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        old = self.st.get(key)
        create = old.create_revision if old else self.rev
        version = old.version + 1 if old else 1
        self.st[key] = KeyValue(key, create, self.rev, version, value, lease)
        self.changed = True

    def delete(self, start: bytes, end: bytes) -> int:
        victims = [k for k in self.st if Model.in_range(k, start, end)]
        for k in victims:
            del self.st[k]
        if victims:
            self.changed = True
        return len(victims)

    def commit(self) -> int:
        if self.changed:
            self.model.rev += 1
            self.model.states[self.model.rev] = self.st
        return self.model.rev
