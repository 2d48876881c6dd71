"""The bearer tokens /v1/* accepts: `api_token` and every token of `api_token_file`.

Contract. `Tokens.accepts(headers)` is true for `Authorization: Bearer <token>` with any
accepted token (compared in constant time), and for every request when no token is configured.
The file holds one token a line (blank lines and `#` comments ignored, at most
`MAX_FILE_TOKENS`), each of the settings contract's token characters. It is how a token rotates
without a failed request: the file lists the current and the next token while clients move
over, then the next alone. The file is read at start (a bad or missing file fails the start),
again when it changes (looked at no more than once every `RECHECK_S`, from the request path:
one stat, no thread; a Kubernetes Secret volume swaps its file the same way), and on reload
(SIGHUP, POST /admin/reload). A file that turns bad later keeps the tokens read before, with an
error logged: a half-written rotation must not lock every client out. No token is ever logged.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from typing import Mapping

from torchfleet_compat.runtime_settings import FIELDS, parse_value

from .config import ConfigError

log = logging.getLogger(__name__)

RECHECK_S = 1.0
MAX_FILE_TOKENS = 8


def read_token_file(path: str) -> list[str]:
    """The tokens of `path`; ConfigError naming the file and the line when it cannot serve."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"api_token_file = {path!r} is invalid (cannot read it: {exc}); allowed: "
            f"{FIELDS['api_token_file'].allowed}"
        ) from None
    tokens = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            tokens.append(parse_value("api_token", text))
        except ValueError as exc:  # the sentence names the line, never the token
            raise ConfigError(
                f"api_token_file = {path!r} is invalid (line {number}: {exc}); allowed: "
                f"one token a line of {FIELDS['api_token'].allowed}"
            ) from None
    if not tokens or len(tokens) > MAX_FILE_TOKENS:
        raise ConfigError(
            f"api_token_file = {path!r} is invalid (it holds {len(tokens)} tokens); allowed: "
            f"1..{MAX_FILE_TOKENS} tokens, one a line"
        )
    return tokens


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class Tokens:
    def __init__(self, token: str | None, path: str | None) -> None:
        self._given = [token] if token else []
        self._path = path
        self._lock = threading.Lock()
        self._looked = time.monotonic()
        self._seen = _stamp(path) if path else None
        self._accepted = [t.encode() for t in self._given + (read_token_file(path) if path else [])]

    @property
    def enabled(self) -> bool:
        return bool(self._accepted)

    def __len__(self) -> int:
        return len(self._accepted)

    def reload(self) -> bool:
        """Read the file again now; False (the old tokens kept, an error logged) when it cannot."""
        if not self._path:
            return True
        with self._lock:
            self._seen = _stamp(self._path)
            try:
                tokens = read_token_file(self._path)
            except ConfigError as exc:
                log.error("tokens not changed: %s", exc)
                return False
            self._accepted = [t.encode() for t in self._given + tokens]
        log.info("api tokens read from %s: %d accepted", self._path, len(self._accepted))
        return True

    def changed(self) -> bool:
        """Whether the token file differs from the one last read (a cheap stat)."""
        return self._path is not None and _stamp(self._path) != self._seen

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if self._path is None or now - self._looked < RECHECK_S:
            return
        self._looked = now
        if _stamp(self._path) != self._seen:
            self.reload()

    def accepts(self, headers: Mapping[str, str]) -> bool:
        self._maybe_reload()
        if not self._accepted:
            return True
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        sent = given.strip().encode()
        # every candidate compared, so the time taken does not say which one matched
        return sum(hmac.compare_digest(sent, t) for t in self._accepted) > 0
