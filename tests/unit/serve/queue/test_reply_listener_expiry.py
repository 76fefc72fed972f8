"""ReplyListener.expire_later: delivered answers' TTLs are shortened inside the trim's one pipeline (producer.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from llmfleet.serve.queue.config import QueueSettings
from llmfleet.serve.queue.producer import Producer, ReplyListener


class FakePipeline:
    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    async def __aenter__(self) -> FakePipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> None:
            self.commands.append((name, args, kwargs))

        return record

    async def execute(self) -> list[Any]:
        self.client.executed.append(self.commands)
        if self.client.fail:
            raise RedisConnectionError("connection refused")
        return [self.client.answers.get(name, 1) for name, _args, _kwargs in self.commands]


class FakeClient:
    def __init__(self) -> None:
        self.executed: list[list[tuple[str, tuple[Any, ...], dict[str, Any]]]] = []
        self.fail = False
        self.answers: dict[str, Any] = {}

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        assert transaction is False
        return FakePipeline(self)

    def register_script(self, script: str) -> object:
        return object()


def test_the_keys_to_expire_go_in_the_next_trim_and_only_once() -> None:
    client = FakeClient()
    listener = ReplyListener(client, "p:reply:gw")  # type: ignore[arg-type]
    listener.expire_later(["p:result:a", "p:job:a"], 60)
    asyncio.run(listener._trim())
    [commands] = client.executed
    assert [name for name, _a, _k in commands] == ["xtrim", "expire", "expire", "expire"]
    assert commands[2:] == [
        ("expire", ("p:result:a", 60), {"lt": True}),
        ("expire", ("p:job:a", 60), {"lt": True}),
    ]
    asyncio.run(listener._trim())
    assert [name for name, _a, _k in client.executed[1]] == ["xtrim", "expire"]


def test_keys_not_expired_because_redis_failed_are_tried_at_the_next_trim() -> None:
    client = FakeClient()
    listener = ReplyListener(client, "p:reply:gw")  # type: ignore[arg-type]
    listener.expire_later(["p:result:a"], 60)
    client.fail = True
    with pytest.raises(RedisConnectionError):
        asyncio.run(listener._trim())
    client.fail = False
    listener.expire_later(["p:result:b"], 60)
    asyncio.run(listener._trim())
    expired = [args[0] for name, args, _k in client.executed[-1] if name == "expire" and args[0] != "p:reply:gw"]
    assert expired == ["p:result:a", "p:result:b"]


def test_a_delivered_answer_shortens_its_result_and_its_job_record() -> None:
    producer = Producer(FakeClient(), QueueSettings(prefix="p"), "gw")  # type: ignore[arg-type]
    assert producer.delivered_keys("abc") == ["p:result:abc", "p:job:abc"]


def test_the_grace_is_a_setting_of_at_least_one_second() -> None:
    assert QueueSettings().delivered_grace_s == 60
    with pytest.raises(ValueError, match="delivered_grace_s"):
        QueueSettings(delivered_grace_s=0)


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ({"get": '{"status": 200, "body": {"ok": 1}}', "exists": 0}, 200),
        ({"get": None, "exists": 1}, "pending"),
        ({"get": None, "exists": 0}, "lost"),
    ],
)
def test_the_poll_reads_the_result_before_the_job_in_one_round_trip(answers: dict[str, Any], expected: Any) -> None:
    client = FakeClient()
    client.answers = answers
    producer = Producer(client, QueueSettings(prefix="p"), "gw")  # type: ignore[arg-type]
    polled = asyncio.run(producer.poll("abc"))
    # GET first: a result written between the two commands leaves the job in place, so it reads "pending".
    assert client.executed == [[("get", ("p:result:abc",), {}), ("exists", ("p:job:abc",), {})]]
    assert (polled if isinstance(polled, str) else polled.status) == expected
