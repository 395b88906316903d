"""The simple-token table: a token lives --auth-token-ttl seconds from when
it was applied or last used on this replica (etcd's simpleTokenTTLKeeper),
and goes with its user's deletion or password change, or with auth off."""

from __future__ import annotations

from brain.engine.tokens import DEFAULT_TOKEN_TTL, TokenTable
from brain.mvcc.auth_apply import TOKEN_ASSIGN, TOKENS_DROPPED, TOKENS_OF_USER_DROPPED


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_token_lives_its_ttl_from_its_last_use():
    clock = Clock()
    t = TokenTable(10, clock)
    t.apply([(TOKEN_ASSIGN, "a.1", "alice")])
    clock.now += 9
    assert t.user_of("a.1") == "alice"  # used: ten seconds more from now
    clock.now += 9
    assert t.user_of("a.1") == "alice"
    clock.now += 10
    assert t.user_of("a.1") is None and len(t) == 0
    assert t.user_of("never.1") is None


def test_tokens_go_with_their_user_or_all_at_once():
    t = TokenTable(10, Clock())
    t.apply([(TOKEN_ASSIGN, "a.1", "alice"), (TOKEN_ASSIGN, "a.2", "alice"), (TOKEN_ASSIGN, "b.1", "bob")])
    t.apply([(TOKENS_OF_USER_DROPPED, "alice")])
    assert (t.user_of("a.1"), t.user_of("a.2"), t.user_of("b.1")) == (None, None, "bob")
    t.apply([(TOKENS_DROPPED,)])
    assert t.user_of("b.1") is None


def test_expired_tokens_are_swept_and_a_ttl_of_0_is_the_default():
    clock = Clock()
    t = TokenTable(5, clock)
    t.apply([(TOKEN_ASSIGN, f"t.{i}", "u") for i in range(100)])
    clock.now += 6
    t.apply([(TOKEN_ASSIGN, "new.1", "u")])
    assert len(t) == 1
    assert TokenTable(0).ttl == DEFAULT_TOKEN_TTL == 300.0
