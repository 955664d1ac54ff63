"""Team API keys: the key alone decides the team, and so the rollouts topic a request can reach.

Keys come from environment variables (`key_env`) or are given as their SHA-256 (`key_sha256`); the
gateway keeps only digests and compares them in constant time. No key is ever logged: a request
with no key or a wrong one is answered 401 and counted, nothing more.
"""
from __future__ import annotations

import hashlib
import hmac
import os

from streamrft.config import GatewayTeam


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class TeamKeys:
    def __init__(self, teams: list[GatewayTeam], environ: dict[str, str] | None = None):
        env = os.environ if environ is None else environ
        self._digests: list[tuple[bytes, str]] = []
        for t in teams:
            if t.key_env is not None:
                key = env.get(t.key_env)
                if not key:
                    raise ValueError(f"gateway.teams[{t.name}].key_env: environment variable {t.key_env} is not set")
                d = digest(key)
            else:
                d = t.key_sha256
            if any(hmac.compare_digest(d.encode(), other) for other, _ in self._digests):
                raise ValueError(f"gateway.teams[{t.name}]: the same key as another team")
            self._digests.append((d.encode(), t.name))
        self.names = [t.name for t in teams]

    def team_of(self, authorization: str | None) -> str | None:
        """The team whose key is in `Authorization: Bearer <key>`, or None."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        given = digest(authorization[len("Bearer "):].strip()).encode()
        team = None
        for d, name in self._digests:  # every digest compared: the time says nothing about which matched
            if hmac.compare_digest(given, d):
                team = name
        return team
