"""API keys with roles, stored hashed.

A key is `vk_<key id>_<secret>`; the key file keeps only `sha256(key)`, the id, a name and roles,
so a leaked key file grants nothing. Keys are random 256-bit tokens, which is why a plain SHA-256
(no slow KDF) is the right hash: there is nothing to brute-force. The id lets the service find the
entry without comparing against every hash, and names the caller in the audit store.

Roles: `match` (trials and matching), `audit` (read decisions and their pages, metrics), `review`
(review a decision: confirm, correct, flag; read its history), `trial_owner` (revise a trial's
program, read its flags), `admin` (everything, including uploading reviewed trial programs).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from verdict.core.errors import describe_validation_error
from verdict.train.run_dir import write_atomic

from .errors import KeysUnavailable, ServeConfigError

log = logging.getLogger("verdict.serve.auth")
Role = Literal["match", "audit", "review", "trial_owner", "admin"]
ROLES: tuple[str, ...] = ("match", "audit", "review", "trial_owner", "admin")
PREFIX = "vk_"


class KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9]{8}$")
    name: str = Field(min_length=1, max_length=100)
    roles: list[Role] = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at: float
    revoked: bool = False
    expires_at: float | None = Field(None, description="unix time the key is refused from; None: never")

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at

    def allows(self, role: str) -> bool:
        return not self.revoked and not self.expired() and ("admin" in self.roles or role in self.roles)


class KeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["verdict.api_keys/v1"] = "verdict.api_keys/v1"
    keys: list[KeyEntry] = Field(default_factory=list)


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    """The key file, re-read when it changes on disk (keys can be added or revoked while serving)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._mtime: int | None = None
        self._by_id: dict[str, KeyEntry] = {}
        self._loaded = False  # whether a good copy of the file was read

    # -- file ------------------------------------------------------------------------------------
    def load(self) -> KeyFile:
        if not self.path.exists():
            return KeyFile()
        try:
            return KeyFile.model_validate_json(self.path.read_bytes())
        except ValidationError as e:
            raise ServeConfigError(
                f"API key file {self.path} is invalid", describe_validation_error(e, "keys")
            ) from None
        except (OSError, ValueError) as e:
            raise ServeConfigError(f"cannot read API key file {self.path}: {e}") from None

    def _save(self, kf: KeyFile) -> None:
        write_atomic(self.path, kf.model_dump_json(indent=2) + "\n")  # a temp file made 0600, renamed

    def create_empty(self) -> None:
        """Write an empty key file (0600) where none is: `verdict serve api|up --init`."""
        if not self.path.exists():
            self._save(KeyFile())

    def add(self, name: str, roles: list[str], expires_days: float | None = None) -> tuple[str, KeyEntry]:
        """Create a key; the plain key is returned once and never stored. ``expires_days``: refused
        that many days from now."""
        if expires_days is not None and expires_days <= 0:
            raise ServeConfigError(f"--expires-days must be positive, not {expires_days}")
        bad = [r for r in roles if r not in ROLES]
        if bad or not roles:
            raise ServeConfigError(f"unknown role(s) {bad or '(none given)'}; roles are {', '.join(ROLES)}")
        with self._lock:
            kf = self.load()
            taken = {k.id for k in kf.keys}
            key_id = secrets.token_hex(4)
            while key_id in taken:
                key_id = secrets.token_hex(4)
            key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
            entry = KeyEntry(
                id=key_id,
                name=name,
                roles=sorted(set(roles), key=ROLES.index),
                sha256=_hash(key),
                created_at=time.time(),
                expires_at=time.time() + expires_days * 86400 if expires_days is not None else None,
            )
            kf.keys.append(entry)
            self._save(kf)
            self._mtime = None
        return key, entry

    def revoke(self, key_id: str) -> KeyEntry:
        with self._lock:
            kf = self.load()
            for i, k in enumerate(kf.keys):
                if k.id == key_id:
                    kf.keys[i] = k.model_copy(update={"revoked": True})
                    self._save(kf)
                    self._mtime = None
                    return kf.keys[i]
        raise ServeConfigError(f"no API key with id '{key_id}' in {self.path}")

    # -- lookups ---------------------------------------------------------------------------------
    def _refresh(self) -> None:
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = -1
        if mtime == self._mtime:
            return
        try:
            keys = self.load().keys
        except ServeConfigError as e:
            if not self._loaded:  # no good copy yet: refuse clearly, never a 500
                raise KeysUnavailable(f"the API key file cannot be read: {e.summary}") from None
            # A truncated or half-written file at run time: keep serving with the last good keys.
            log.error(
                "API key file %s unreadable (%s): keeping the %d keys loaded before",
                self.path,
                e.summary,
                len(self._by_id),
            )
            self._mtime = mtime  # tried again when the file changes
            return
        self._by_id = {k.id: k for k in keys}
        self._mtime, self._loaded = mtime, True

    def authenticate(self, key: str | None) -> KeyEntry | None:
        """The entry of a valid, unrevoked key; None otherwise (never says which part was wrong)."""
        if not key or not key.startswith(PREFIX):
            return None
        key_id = key[len(PREFIX) :].split("_", 1)[0]
        with self._lock:
            self._refresh()
            entry = self._by_id.get(key_id)
        if entry is None or entry.revoked or entry.expired():
            return None
        return entry if hmac.compare_digest(entry.sha256, _hash(key)) else None

    def entry(self, key_id: str) -> KeyEntry | None:
        """The entry of a valid, unrevoked key id (a login session's key, re-read from the file)."""
        with self._lock:
            self._refresh()
            entry = self._by_id.get(key_id)
        return None if entry is None or entry.revoked or entry.expired() else entry

    def count(self) -> int:
        with self._lock:
            self._refresh()
            return sum(not k.revoked for k in self._by_id.values())
