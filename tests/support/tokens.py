"""A test RSA key pair and JWT bearer tokens signed with it (PyJWT)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ISSUER = "https://issuer.test"
AUDIENCE = "chainweaver-tests"


class KeyPair:
    """An RSA key pair; ``token()`` signs, ``write_public()`` saves the PEM public key."""

    def __init__(self) -> None:
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    @property
    def public_pem(self) -> str:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM,
            serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def write_public(self, path: Path) -> Path:
        path.write_text(self.public_pem)
        return path

    def token(self, subject: str, teams: list[str], *, expires_in: float = 3600,
              **claims: Any) -> str:
        now = int(time.time())
        payload = {"sub": subject, "iss": ISSUER, "aud": AUDIENCE, "iat": now,
                   "exp": now + int(expires_in), "teams": teams, "scope": "flows",
                   "client_id": f"client-{subject}", **claims}
        return jwt.encode(payload, self.private, algorithm="RS256")
