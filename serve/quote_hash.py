"""Keyed hashes of note text the audit store does not keep (`store_notes: false`).

A plain SHA-256 of a short quote ("40 years old", "smoker") is found by hashing guesses; an HMAC
under a secret that readers of the store do not hold is not. The secret is per store: 32 random
bytes in a file beside the service's key file (`api.audit_hash_key`, default `audit_hash.key` next
to `api.api_keys`), mode 0600, created on first use. Several replicas of one PostgreSQL store share
one file (copy it to each).

A reference reads `hmac-sha256:<key id>:<16 hex>`; the key id (a hash of the secret, not the secret)
says which secret made it. Rows written before keyed hashing keep their `sha256:<16 hex>` references:
the store is append-only and they are never rewritten; `quote_hashing` marks them `unkeyed` when read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Literal

from .errors import ServeConfigError

KEYED, UNKEYED = "hmac-sha256", "sha256"
QuoteHashing = Literal["keyed", "unkeyed"]


class QuoteHasher:
    def __init__(self, secret: bytes):
        self._secret = secret
        self.key_id = hashlib.sha256(b"verdict audit hash key id\0" + secret).hexdigest()[:8]

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> QuoteHasher:
        """The store's secret, created (0600) on first use; an existing file is made 0600."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:  # made before (or by another replica starting now): read it
                os.chmod(path, 0o600)
            else:
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(32) + "\n")
            text = path.read_text().strip()
        except OSError as e:
            raise ServeConfigError(f"cannot read or create the audit hash key {path}: {e}") from None
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            secret = b""
        if len(secret) < 16:
            raise ServeConfigError(
                f"the audit hash key {path} is not a hex secret of 32+ characters; restore it from a backup "
                "(a new key makes new references that cannot be compared with the old ones)"
            )
        return cls(secret)

    def ref(self, text: str) -> str:
        digest = hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()[:16]
        return f"{KEYED}:{self.key_id}:{digest}"


def quote_hashing(artifacts: dict) -> QuoteHashing | None:
    """How a stored row's not-kept text is hashed: `unkeyed` when any reference is a plain SHA-256 (a
    row from before keyed hashing), `keyed`, or None when the row keeps its text."""
    dump = json.dumps(artifacts, ensure_ascii=False)
    if f"[not kept: {UNKEYED}:" in dump:
        return "unkeyed"
    return "keyed" if f"[not kept: {KEYED}:" in dump else None
