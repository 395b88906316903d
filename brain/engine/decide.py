"""How a leader decides a batch of writes: the batch applied to the store,
one journal payload of its effects (the committer runs it under its lock,
brain.engine.committer; what the NOSPACE alarm refuses first is
brain.engine.alarms.adds_data)."""

from __future__ import annotations

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

