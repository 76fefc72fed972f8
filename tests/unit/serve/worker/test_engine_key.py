"""The engines' API key: read from a secret file, sent on every engine request.

The engine here is a FAKE: an aiohttp server on 127.0.0.1 that records the
Authorization header of each request. The real vLLM's guard (401 on /v1
without the key) is proven in the lab (tests/lab/test_site.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web

from llmfleet.serve.queue.config import SettingsError
from llmfleet.serve.worker.config import WorkerSettings
from llmfleet.serve.worker.engine import engine_session

KEY = "engine-key-for-a-unit-test"


def _settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> WorkerSettings:
    monkeypatch.setenv("LLMFLEET_WORKER_ENGINES", '["http://127.0.0.1:8000"]')
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return WorkerSettings.from_env()


def _key_file(tmp_path: Path, mode: int = 0o400, content: str = KEY + "\n") -> Path:
    path = tmp_path / "engine_api_key"
    path.write_text(content)
    path.chmod(mode)
    return path


def test_no_key_file_means_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings(monkeypatch).engine_key() is None


def test_the_key_is_read_from_its_file_stripped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = _settings(monkeypatch, LLMFLEET_WORKER_ENGINE_KEY_FILE=str(_key_file(tmp_path)))
    assert settings.engine_key() == KEY


def test_a_key_given_as_a_value_is_refused_naming_the_file_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SettingsError, match="LLMFLEET_WORKER_ENGINE_KEY_FILE") as refused:
        _settings(monkeypatch, LLMFLEET_WORKER_ENGINE_KEY=KEY)
    assert KEY not in str(refused.value)


@pytest.mark.parametrize(
    ("mode", "content", "reason"),
    [(0o644, KEY, "readable by everyone"), (0o400, "\n", "is empty")],
)
def test_a_bad_key_file_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: int, content: str, reason: str
) -> None:
    path = _key_file(tmp_path, mode, content)
    with pytest.raises(SettingsError, match=reason) as refused:
        _settings(monkeypatch, LLMFLEET_WORKER_ENGINE_KEY_FILE=str(path))
    assert "LLMFLEET_WORKER_ENGINE_KEY_FILE" in str(refused.value) and KEY not in str(refused.value)


def _seen_authorization(api_key: str | None) -> list[str | None]:
    seen: list[str | None] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"data": []})

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/v1/models", record)
        app.router.add_get("/health", record)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            async with engine_session(2, 1.0, 1.0, api_key) as http:
                for path in ("/health", "/v1/models"):
                    async with http.get(url + path) as response:
                        assert response.status == 200
        finally:
            await runner.cleanup()

    asyncio.run(main())
    return seen


def test_the_session_sends_the_key_on_every_request() -> None:
    assert _seen_authorization(KEY) == [f"Bearer {KEY}", f"Bearer {KEY}"]


def test_without_a_key_the_session_sends_no_authorization() -> None:
    assert _seen_authorization(None) == [None, None]
