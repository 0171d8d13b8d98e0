"""Who may write through the web page: one operator token, sessions, per-form CSRF tokens.

Writes are off unless the page was started with a token (``--token`` or
$SLOTLESS_UI_TOKEN). The operator signs in once with it (compared in constant time); the
answer sets a cookie holding a **random session id kept in this process's memory**, not
anything derived from the token: the cookie never lets anyone recover or replay the token,
a session ends when it expires, is signed out, or the page restarts, and changing the
token needs no second secret. (An HMAC of the token would survive restarts and be shared
by several page processes, but every cookie ever issued would stay valid until the token
changed.) The cookie is HttpOnly and SameSite=Strict, and Secure when served over HTTPS.

Every write is a POST carrying a CSRF token: an HMAC, keyed by a random per-session key,
of the form's action (its path), compared in constant time. A form's token is good for
that action only, in that session only.

**Named tokens.** The token may be a comma-separated list of ``NAME:TOKEN`` pairs (a bare
token is named ``operator``), so that what an operator does records who did it: the web
session keeps the name, and the JSON API (``Authorization: Bearer TOKEN``, :mod:`.api`)
hands it to its handlers. Every token is compared, in constant time, on every check, so
the time taken says nothing about which token nearly matched.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

COOKIE = "slotless_session"
SESSION_TTL = 12 * 3600.0  # seconds a session lasts without being used
MAX_SESSIONS = 1000  # the oldest are forgotten past this: a login loop cannot grow memory


@dataclass
class Session:
    id: str
    csrf_key: bytes
    expires: float
    flash: tuple[str, str] | None = None  # (kind: "ok" | "error", message), shown once
    form: dict[str, str] = field(default_factory=dict)  # what a refused form held
    who: str = "operator"  # the name of the token it signed in with


@dataclass(frozen=True)
class Writes:
    """What a page needs to draw its forms: whether writes are on, the session, the path."""

    enabled: bool
    session: Session | None
    path: str

    def csrf(self, action: str) -> str:
        assert self.session is not None
        return csrf_token(self.session, action)


def parse_tokens(text: str | None) -> dict[str, str]:
    """``"alice:s3cret,bob:0ther"`` -> {name: token}; a bare token is named ``operator``.
    A malformed list is a :class:`ValueError` naming the entry (never the token)."""
    tokens: dict[str, str] = {}
    for i, entry in enumerate(e.strip() for e in (text or "").split(",")):
        if not entry:
            continue
        name, sep, token = entry.partition(":")
        if not sep:
            name, token = "operator", entry
        if not name.strip() or not token or name.strip() in tokens:
            raise ValueError(
                f"token entry {i + 1}: expected NAME:TOKEN with a unique, non-empty name "
                "and a non-empty token"
            )
        tokens[name.strip()] = token
    return tokens


class Auth:
    def __init__(self, token: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._tokens = {name: t.encode() for name, t in parse_tokens(token).items()}
        self._token = b"" if self._tokens else None  # writes are on when any token is set
        self._clock = clock
        self._sessions: dict[str, Session] = {}

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def who(self, given: str) -> str | None:
        """The name of the token ``given`` is, or None; every token compared in constant time."""
        found = None
        for name, token in self._tokens.items():
            if hmac.compare_digest(given.encode(), token):
                found = name
        return found

    def login(self, given: str) -> Session | None:
        """A new session when ``given`` is a token; None otherwise (or writes are off)."""
        who = self.who(given) if self._token is not None else None
        if who is None:
            return None
        now = self._clock()
        for sid in [s.id for s in self._sessions.values() if s.expires < now]:
            del self._sessions[sid]
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        session = Session(
            secrets.token_urlsafe(32), secrets.token_bytes(32), now + SESSION_TTL, who=who
        )
        self._sessions[session.id] = session
        return session

    def session(self, request: web.Request) -> Session | None:
        """The request's live session, from its cookie; None if it has none."""
        if self._token is None:
            return None
        session = self._sessions.get(request.cookies.get(COOKIE, ""))
        if session is None:
            return None
        now = self._clock()
        if session.expires < now:
            del self._sessions[session.id]
            return None
        session.expires = now + SESSION_TTL
        return session

    def logout(self, session: Session) -> None:
        self._sessions.pop(session.id, None)

    def writes(self, request: web.Request) -> Writes:
        return Writes(self.enabled, self.session(request), request.path)


def csrf_token(session: Session, action: str) -> str:
    return hmac.new(session.csrf_key, action.encode(), hashlib.sha256).hexdigest()


def csrf_ok(session: Session, action: str, given: str) -> bool:
    return hmac.compare_digest(csrf_token(session, action).encode(), given.encode())


def set_cookie(response: web.StreamResponse, request: web.Request, session: Session) -> None:
    response.set_cookie(
        COOKIE,
        session.id,
        httponly=True,
        samesite="Strict",
        secure=request.secure,
        path="/",
        max_age=int(SESSION_TTL),
    )


def clear_cookie(response: web.StreamResponse) -> None:
    response.del_cookie(COOKIE, path="/")
