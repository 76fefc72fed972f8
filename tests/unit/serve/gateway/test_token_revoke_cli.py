"""`llmfleet token revoke`: what it revokes, for how long, and what it refuses before reaching Redis."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from llmfleet import cli
from llmfleet.serve.gateway.auth import mint

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    monkeypatch.setattr(cli, "COMMAND_GROUPS", ("llmfleet.ops.token",))
    for name in ("LLMFLEET_REDIS_URL", "LLMFLEET_REDIS_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)

    def _run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


def test_an_expired_token_needs_no_revocation(run: Run, tmp_path: Path, secret_file: Path) -> None:
    token = tmp_path / "old.jwt"
    token.write_text(mint(subject="a", key=secret_file.read_text().strip(), ttl_s=60, now=1_000_000))
    code, out, err = run("token", "revoke", "--token-file", str(token))
    assert (code, err) == (0, "")
    assert "has expired; nothing to revoke" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--jti", "abc"], "with --ttl"),
        (["--ttl", "1h"], "--token-file FILE, or --jti"),
        (["--token-file", "x.jwt", "--jti", "abc"], "not both"),
        (["--token-file", "/nonexistent/x.jwt"], "cannot read"),
        (["--jti", "a" * 257, "--ttl", "1h"], "longer than 256"),
    ],
)
def test_bad_arguments_are_refused_before_redis(run: Run, argv: list[str], message: str) -> None:
    code, out, err = run("token", "revoke", *argv)
    assert code != 0 and out == ""
    assert message in err


def test_minting_still_needs_sub_and_secret_file(run: Run, secret_file: Path) -> None:
    code, out, err = run("token", "--secret-file", str(secret_file))
    assert code != 0 and out == ""
    assert "--sub and --secret-file are required" in err
