"""Simple tokens this replica honours: which user each names, until when.

Authenticate with simple tokens is a write: the token the api chose is
journaled (brain.mvcc.auth_apply) and every replica that applies the record
learns it here, so a token issued through one replica is honoured by all,
as etcd's members each assign a simple token when they apply its
Authenticate entry.  Time is this replica's own: a token lives
``--auth-token-ttl`` seconds from when the replica applied it or last saw it
used (etcd's simpleTokenTTLKeeper, reset on every use), so a token used on
one replica may expire on another where it was idle, as on etcd's members.
Tokens are not journaled state: a restart forgets them (etcd's live in
memory too) and clients authenticate again.

The committer feeds the table when a batch is published (``apply``); any
thread looks tokens up (``user_of``).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ..mvcc.auth_apply import TOKEN_ASSIGN, TOKENS_OF_USER_DROPPED

DEFAULT_TOKEN_TTL = 300.0  # etcd's --auth-token-ttl
SWEEP_INTERVAL = 1.0  # etcd's simpleTokenTTLResolution


class TokenTable:
    def __init__(self, ttl: float = DEFAULT_TOKEN_TTL, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl if ttl > 0 else DEFAULT_TOKEN_TTL  # etcd: a TTL <= 0 means the default
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens: dict[str, list] = {}  # token -> [user, deadline]
        self._swept = clock()

    def apply(self, effects) -> None:
        """A published batch's token effects (brain.mvcc.auth_apply)."""
        now = self._clock()
        with self._lock:
            for effect in effects:
                kind = effect[0]
                if kind == TOKEN_ASSIGN:
                    self._tokens[effect[1]] = [effect[2], now + self.ttl]
                elif kind == TOKENS_OF_USER_DROPPED:
                    user = effect[1]
                    for token in [t for t, entry in self._tokens.items() if entry[0] == user]:
                        del self._tokens[token]
                else:
                    self._tokens.clear()
            if now - self._swept >= SWEEP_INTERVAL:
                self._sweep(now)

    def user_of(self, token: str) -> str | None:
        """The user ``token`` names, its life renewed; None for a token
        unknown here or expired."""
        now = self._clock()
        with self._lock:
            entry = self._tokens.get(token)
            if entry is None:
                return None
            if now >= entry[1]:
                del self._tokens[token]
                return None
            entry[1] = now + self.ttl
            if now - self._swept >= SWEEP_INTERVAL:
                self._sweep(now)
            return entry[0]

    def _sweep(self, now: float) -> None:
        for token in [t for t, entry in self._tokens.items() if now >= entry[1]]:
            del self._tokens[token]
        self._swept = now

    def __len__(self) -> int:
        with self._lock:
            return len(self._tokens)
