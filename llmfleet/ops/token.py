"""`llmfleet token`: mint a JWT for the gateway.

    llmfleet token --sub alice --secret-file /run/secrets/gateway_jwt_secret \\
        [--ttl 12h] [--models tiny,other | --models '*'] [--tenant acme] [--priority high] [--tier gold]

HS256 signs with the shared secret the gateway verifies with; with
--algorithm RS256/ES256, --secret-file is the PEM private key whose public
half the gateway holds. The token goes to stdout and nothing else does: the
key never appears on a command line or in a log.

    llmfleet token revoke --token-file alice.jwt      (or - for stdin)
    llmfleet token revoke --jti 3f2a... --ttl 12h

writes `<prefix>:revoked:<jti>` to Redis, kept as long as the token could
still be accepted; a gateway with LLMFLEET_GATEWAY_JWT_REVOCATION=true then
answers it 401 token_revoked. Redis comes from LLMFLEET_REDIS_URL,
LLMFLEET_REDIS_USERNAME (the redis role's redis_revoker_user, which may write
those keys and nothing else) and LLMFLEET_REDIS_PASSWORD_FILE, the prefix from
LLMFLEET_QUEUE_PREFIX.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from llmfleet.errors import LlmfleetError

if TYPE_CHECKING:  # imported when revoking, not for every `llmfleet` command
    from redis.asyncio import Redis

    from llmfleet.serve.queue.keys import Keys

TTL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_TTL_S = 366 * 86400
# A revocation outlives the token's exp by the largest leeway a gateway may allow (LLMFLEET_GATEWAY_JWT_LEEWAY_S).
REVOCATION_MARGIN_S = 600
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


def to_revoke(args: argparse.Namespace, now: float) -> tuple[str, int]:
    """(jti, seconds the revocation must last) from --token-file, or from --jti and --ttl."""
    import jwt

    if args.token_file is not None:
        if args.jti is not None or args.ttl is not None:
            raise LlmfleetError("give --token-file, or --jti with --ttl, not both")
        text = sys.stdin.read() if args.token_file == "-" else _read_token(Path(args.token_file))  # noqa: S105 (- is stdin)
        try:
            # Not verified: revoking only ever refuses a token, and the gateway checks the signature anyway.
            claims = jwt.decode(text.strip(), options={"verify_signature": False})
        except jwt.InvalidTokenError as error:
            raise LlmfleetError(f"--token-file: not a JWT ({type(error).__name__})") from None
        token_id, expires = claims.get("jti"), claims.get("exp")
        if not isinstance(token_id, str) or not token_id:
            raise LlmfleetError("--token-file: the token has no jti claim, so it cannot be revoked (only expire)")
        if not isinstance(expires, int | float):
            raise LlmfleetError("--token-file: the token has no exp claim")
        return token_id, int(expires - now) + REVOCATION_MARGIN_S
    if args.jti is None or args.ttl is None:
        raise LlmfleetError("give --token-file FILE, or --jti ID with --ttl (the token's remaining lifetime)")
    return args.jti, parse_ttl(args.ttl) + REVOCATION_MARGIN_S


def _read_token(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as error:
        raise LlmfleetError(f"--token-file: cannot read {path}: {error.strerror or type(error).__name__}") from None


def revoke(args: argparse.Namespace) -> int:
    from llmfleet.serve.gateway.auth import revoked_key
    from llmfleet.serve.queue.config import run_against_redis

    now = time.time()
    token_id, ttl_s = to_revoke(args, now)
    if len(token_id) > 256:
        raise LlmfleetError("the jti is longer than 256 characters; no gateway accepts such a token")
    if ttl_s <= 0:
        print(f"jti {token_id}: the token has expired; nothing to revoke")
        return 0

    async def write(client: Redis, keys: Keys) -> int:
        await client.set(revoked_key(keys, token_id), "1", ex=ttl_s)
        print(f"revoked jti {token_id} for {ttl_s} s")
        return 0

    return run_against_redis("llmfleet token revoke", "llmfleet-token-revoke", write)


def run(args: argparse.Namespace) -> int:
    if args.sub is None or args.secret_file is None:
        raise LlmfleetError("llmfleet token: --sub and --secret-file are required to mint a token")
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
    # Not argparse-required: `llmfleet token revoke` shares this parser. run() insists on them.
    parser.add_argument("--sub", help="subject: who the token is for (rate limits count per subject); required")
    parser.add_argument(
        "--secret-file",
        help="HS*: the gateway's shared secret (during a rotation, the current one); RS*/ES*: a PEM private key;"
        " required",
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
    commands = parser.add_subparsers(dest="token_command", metavar="COMMAND")
    revoke_parser = commands.add_parser(
        "revoke",
        help="revoke a token by its jti (gateways with LLMFLEET_GATEWAY_JWT_REVOCATION=true refuse it)",
        description=(
            "Write <prefix>:revoked:<jti> to Redis, kept until the token would have expired (plus 600 s of leeway)."
            " Redis settings come from LLMFLEET_REDIS_URL, LLMFLEET_REDIS_USERNAME and LLMFLEET_REDIS_PASSWORD_FILE;"
            " connect as the redis role's revoker user."
        ),
    )
    revoke_parser.add_argument("--token-file", help="the token to revoke (its jti and exp are read), or - for stdin")
    revoke_parser.add_argument("--jti", help="the jti of the token to revoke, when the token itself is gone")
    revoke_parser.add_argument("--ttl", help="with --jti: how long the token may still live (e.g. 12h)")
    revoke_parser.set_defaults(handler=revoke)
