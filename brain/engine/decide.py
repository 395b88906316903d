"""How a leader decides a batch of writes: which requests the NOSPACE
alarm refuses, and the batch applied to the store, one journal payload of
its effects (the committer runs it under its lock, brain.engine.committer)."""

from __future__ import annotations

from ..mvcc.requests import LeaseGrantRequest, PutRequest, TxnRequest
from ..mvcc.store import Store
from .items import Effects
from .pending import Pending


def decide(store: Store, admitted: list[Pending]) -> tuple[list, bytes]:
    """Apply a batch to the store (lock held): requests are decided,
    effects payloads are replayed as they are.  Returns one result per
    pending write and the journal payload of them all."""
    if not any(type(p.request) is Effects for p in admitted):
        return store.apply([p.request for p in admitted])
    results: list = []
    parts: list[bytes] = []
    run: list = []

    def flush_run() -> None:
        if run:
            res, payload = store.apply(run)
            results.extend(res)
            parts.append(payload)
            run.clear()

    for p in admitted:
        if type(p.request) is not Effects:
            run.append(p.request)
            continue
        flush_run()
        payload = p.request.payload
        try:
            store.check_continues(payload)
        except ValueError as e:
            results.append(e)
            continue
        store.replay(payload, live=True)
        results.append(store.revision)
        parts.append(payload)
    flush_run()
    return results, b"".join(parts)


def adds_data(req) -> bool:
    """What the NOSPACE alarm and an exceeded quota refuse, as etcd 3.6 does
    (its capped applier and quota refuse a request whose cost is above 0): a
    Put, a LeaseGrant, and a Txn with a Put directly in either branch.
    etcd's costTxn counts only those Puts, so a Txn that only deletes, or
    puts only inside a nested Txn, is applied."""
    if isinstance(req, (PutRequest, LeaseGrantRequest)):
        return True
    if isinstance(req, TxnRequest):
        return any(isinstance(op, PutRequest) for op in (*req.success, *req.failure))
    return False

