"""A starting replica's JetStream calls against a NATS cluster still forming."""

import asyncio

import pytest
from nats.js.errors import APIError, BadRequestError, KeyNotFoundError, NoStreamResponseError, ServiceUnavailableError

from brain.journal.natsio import when_answering


class FormingBucket:
    """A bucket whose stream answers 'no responders' ``failures`` times."""

    def __init__(self, failures: int, error=NoStreamResponseError) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def put(self, key: str, value: bytes) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error()
        return 7


def test_the_put_is_retried_until_the_stream_answers():
    kv = FormingBucket(failures=3)
    assert asyncio.run(when_answering(lambda: kv.put("m.1", b"{}"), "test", wait=5.0, pause=0.01)) == 7
    assert kv.calls == 4


def test_a_stream_that_never_answers_fails_after_the_wait():
    kv = FormingBucket(failures=10**9)
    with pytest.raises(NoStreamResponseError):
        asyncio.run(when_answering(lambda: kv.put("m.1", b"{}"), "test", wait=0.2, pause=0.01))
    assert kv.calls >= 2


def _no_peers() -> APIError:
    return BadRequestError(code=400, err_code=10005, description="no suitable peers for placement, peer offline")


def test_a_stream_that_cannot_be_placed_yet_is_retried():
    """A just-formed cluster whose peer has not reported in: JetStream 10005."""
    kv = FormingBucket(failures=2, error=_no_peers)
    assert asyncio.run(when_answering(lambda: kv.put("m.1", b"{}"), "test", wait=5.0, pause=0.01)) == 7
    assert kv.calls == 3


def test_a_meta_layer_between_leaders_is_retried():
    """Servers electing a JetStream meta leader (one was stopped, a
    partition healed) refuse a consumer with 503/10008 for a moment."""
    kv = FormingBucket(failures=2, error=lambda: ServiceUnavailableError(
        code=503, err_code=10008, description="JetStream system temporarily unavailable"))
    assert asyncio.run(when_answering(lambda: kv.put("m.1", b"{}"), "test", wait=5.0, pause=0.01)) == 7
    assert kv.calls == 3


def test_any_other_refusal_is_raised_at_once():
    kv = FormingBucket(failures=1, error=lambda: BadRequestError(code=400, err_code=10052, description="bad"))
    with pytest.raises(BadRequestError):
        asyncio.run(when_answering(lambda: kv.put("m.1", b"{}"), "test", wait=5.0, pause=0.01))
    assert kv.calls == 1


def test_a_client_side_api_error_without_fields_is_raised_as_itself():
    """nats-py raises some APIErrors of its own (KeyNotFoundError) with no
    err_code: they go up as themselves, not as an AttributeError."""
    kv = FormingBucket(failures=1, error=KeyNotFoundError)
    with pytest.raises(KeyNotFoundError):
        asyncio.run(when_answering(lambda: kv.put("m.1", b"{}"), "test", wait=5.0, pause=0.01))
    assert kv.calls == 1

