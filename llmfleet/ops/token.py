"""`llmfleet token`: mint a JWT for the gateway.

    llmfleet token --sub alice --secret-file /run/secrets/gateway_jwt_secret \\
        [--ttl 12h] [--models tiny,other | --models '*'] [--tenant acme] [--priority high] [--tier gold]

HS256 signs with the shared secret the gateway verifies with; with
--algorithm RS256/ES256, --secret-file is the PEM private key whose public
half the gateway holds. The token goes to stdout and nothing else does: the
key never appears on a command line or in a log.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from llmfleet.errors import LlmfleetError

TTL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_TTL_S = 366 * 86400
ALGORITHMS = ("HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "EdDSA")


def parse_ttl(text: str) -> int:
    """'3600', '90s', '15m', '12h' or '7d' -> seconds."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text)
    if not match:
        raise LlmfleetError(f"--ttl {text!r}: give seconds or a number with s, m, h or d (e.g. 12h)")
    seconds = int(match.group(1)) * TTL_UNITS[match.group(2) or "s"]
    if not 0 < seconds <= MAX_TTL_S:
        raise LlmfleetError(f"--ttl {text!r}: must be between 1 s and {MAX_TTL_S // 86400} days")
    return seconds


def parse_models(text: str) -> list[str]:
    if text.strip() == "*":
        return ["*"]
    models = [name.strip() for name in text.split(",") if name.strip()]
    if not models:
        raise LlmfleetError("--models: give model names separated by commas, or '*' for all")
    return models


def parse_priority(text: str | None) -> str | int | None:
    if text is None:
        return None
    return int(text) if text.isdigit() else text


def run(args: argparse.Namespace) -> int:
    from llmfleet.serve.gateway.auth import mint
    from llmfleet.serve.gateway.config import MIN_HMAC_SECRET_LENGTH
    from llmfleet.serve.queue.config import SettingsError, read_secret_file

    hmac = args.algorithm.startswith("HS")
    try:
        key = read_secret_file(
            Path(args.secret_file), "--secret-file", min_length=MIN_HMAC_SECRET_LENGTH if hmac else 1
        )
    except SettingsError as error:
        raise LlmfleetError(str(error)) from None
    if not hmac and "PRIVATE KEY" not in key:
        raise LlmfleetError(
            f"--secret-file: {args.algorithm} signs with a PEM private key; {args.secret_file} is not one"
        )
    try:
        token = mint(
            subject=args.sub,
            key=key,
            algorithm=args.algorithm,
            ttl_s=parse_ttl(args.ttl),
            issuer=args.issuer,
            audience=args.audience,
            models=parse_models(args.models),
            tenant=args.tenant,
            priority=parse_priority(args.priority),
            tier=args.tier,
            key_id=args.kid,
        )
    except (ValueError, TypeError) as error:
        raise LlmfleetError(f"cannot sign with {args.algorithm}: {error}") from None
    sys.stdout.write(token + "\n")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "token",
        help="mint a JWT for the gateway",
        description=(
            "Print a signed JWT for the gateway. The claims (sub, tenant, models, priority, tier) decide what the"
            " token may use, its queue lane and its rate-limit tier; iss, aud and exp are checked by the gateway."
        ),
    )
    parser.add_argument("--sub", required=True, help="subject: who the token is for (rate limits count per subject)")
    parser.add_argument(
        "--secret-file", required=True, help="HS*: the gateway's shared secret; RS*/ES*: a PEM private key"
    )
    parser.add_argument("--ttl", default="1h", help="lifetime: seconds or 15m, 12h, 7d (default 1h)")
    parser.add_argument("--models", default="*", help="comma-separated model names, or '*' for all (default)")
    parser.add_argument("--tenant", help="tenant (default: the subject)")
    parser.add_argument("--priority", help="queue lane name (high, normal, low) or index (0 = highest)")
    parser.add_argument("--tier", help="rate-limit tier (default: the gateway's default tier)")
    parser.add_argument("--algorithm", default="HS256", choices=ALGORITHMS, help="signing algorithm (default HS256)")
    parser.add_argument("--issuer", default="llmfleet", help="iss claim (default llmfleet)")
    parser.add_argument("--audience", default="llmfleet", help="aud claim (default llmfleet)")
    parser.add_argument("--kid", help="key id header, for a gateway verifying with a JWKS")
    parser.set_defaults(handler=run)
