"""``edge-vision token``: mint a signed access token, a new token secret or an API key
(the formats: :mod:`edge_vision.serve.auth`, docs/security.md)."""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
from typing import Any

from ..errors import ConfigError
from ..serve.auth import SCOPES, hash_api_key, mint_token, read_token_secret
from .args import add_config_file_args, config_from_args


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``8h``, ``30d`` as seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 15m, 8h, 30d)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def cmd_token(args: argparse.Namespace) -> int:
    if args.new_secret:
        print(secrets.token_urlsafe(48))
        return 0
    if args.new_api_key:
        key = "evk_" + secrets.token_urlsafe(32)
        print(key)
        print(
            f"# config entry: auth.api_keys: [{{name: {args.new_api_key}, "
            f"sha256: {hash_api_key(key)}, scopes: [{', '.join(args.scope or ['stream'])}]}}]",
            file=sys.stderr,
        )
        return 0
    config = config_from_args(args)
    a = config.auth
    secret = read_token_secret(a.token_secret_file, a.token_secret_env, os.environ)
    if secret is None:
        raise ConfigError(
            "no token secret: set auth.token_secret_file or the "
            f"{config.auth.token_secret_env} environment variable"
        )
    if not args.subject:
        raise ConfigError("edge-vision token needs --subject")
    try:
        token = mint_token(secret, args.subject, parse_duration(args.ttl), args.scope or ["stream"])
    except ValueError as e:
        raise ConfigError(str(e)) from None
    print(token)
    return 0


def register_cli(sub: Any) -> None:
    p = sub.add_parser(
        "token",
        help="mint a signed access token (or a new secret / API key)",
        description="Mint a signed, expiring access token with the node's token secret "
        "(auth.token_secret_file or $EDGE_VISION_TOKEN_SECRET); without a secret yet, "
        "--new-secret makes one. --new-api-key makes an API key instead. The formats and "
        "how a client presents them: docs/security.md.",
    )
    add_config_file_args(p)  # the secret's place comes from the config; no model runs
    p.add_argument("--subject", help="who the token is for, e.g. cam-3 or alice")
    p.add_argument("--ttl", default="8h", help="lifetime: 90s, 15m, 8h, 30d")
    p.add_argument(
        "--scope",
        action="append",
        choices=SCOPES,
        help="allowed scope, repeatable (default: stream)",
    )
    p.add_argument("--new-secret", action="store_true", help="print a fresh token secret")
    p.add_argument(
        "--new-api-key",
        metavar="NAME",
        help="print a fresh API key (stdout) and its config entry (stderr)",
    )
    p.set_defaults(func=cmd_token)
