"""`llmfleet token`: mints tokens the gateway accepts; refuses bad input with a clear message."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from llmfleet import cli
from llmfleet.ops.token import parse_ttl
from llmfleet.serve.gateway.auth import Verifier
from llmfleet.serve.gateway.config import GatewaySettings

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    monkeypatch.setattr(cli, "COMMAND_GROUPS", ("llmfleet.ops.token",))

    def _run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


def test_the_token_is_accepted_by_the_gateway(
    run: Run, secret_file: Path, make_settings: Callable[..., GatewaySettings]
) -> None:
    code, out, err = run(
        "token",
        "--sub",
        "alice",
        "--secret-file",
        str(secret_file),
        "--models",
        "tiny,other",
        "--tenant",
        "acme",
        "--priority",
        "0",
        "--ttl",
        "15m",
    )
    assert code == 0 and err == ""
    principal = Verifier(make_settings()).verify(out.strip())
    assert (principal.subject, principal.tenant, principal.lane) == ("alice", "acme", "high")
    assert principal.models == frozenset({"tiny", "other"})
    assert secret_file.read_text().strip() not in out


def test_a_placeholder_or_missing_secret_is_refused(run: Run, tmp_path: Path) -> None:
    placeholder = tmp_path / "secret"
    placeholder.write_text("CHANGE-ME")
    placeholder.chmod(0o600)
    code, out, err = run("token", "--sub", "a", "--secret-file", str(placeholder))
    assert code == 1 and out == "" and "placeholder" in err
    code, _out, err = run("token", "--sub", "a", "--secret-file", str(tmp_path / "nope"))
    assert code == 1 and "does not exist" in err


def test_ttl_parsing() -> None:
    assert [parse_ttl(text) for text in ("90", "90s", "15m", "12h", "7d")] == [90, 90, 900, 43200, 604800]
    for bad in ("", "0", "1w", "-5", "400d"):
        with pytest.raises(Exception, match="--ttl"):
            parse_ttl(bad)


def test_rs256_needs_a_private_key(run: Run, secret_file: Path) -> None:
    code, _out, err = run("token", "--sub", "a", "--secret-file", str(secret_file), "--algorithm", "RS256")
    assert code == 1 and "PEM private key" in err


def test_claims_on_the_wire(run: Run, secret_file: Path) -> None:
    code, out, _err = run("token", "--sub", "a", "--secret-file", str(secret_file), "--tier", "gold")
    assert code == 0
    import base64

    payload = out.strip().split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["models"] == "*" and claims["tier"] == "gold" and claims["exp"] - claims["iat"] == 3600
    assert {"iss", "aud", "nbf", "jti"} <= set(claims)
