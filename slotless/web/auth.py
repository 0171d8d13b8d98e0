"""Who may write through the web page: named tokens with roles, sessions, CSRF tokens.

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

**Named tokens, with roles.** The token may be a comma-separated list of
``NAME:ROLE:SECRET`` (or ``NAME:SECRET``, an operator; a bare secret is an operator named
``operator``): :mod:`slotless.roles` parses it and holds the one table of the role each
write needs. The web session keeps the token's name and role, and the JSON API
(``Authorization: Bearer TOKEN``, :mod:`.api`) hands both to its handlers: what is done is
recorded under the name, and refused (403) to a role below the action's. Every token is
compared, in constant time, on every check, so the time taken says nothing about which
token nearly matched.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from ..roles import Role, Token, needs, parse_tokens

__all__ = ["Auth", "Role", "Session", "Token", "Writes", "parse_tokens"]

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
    role: Role = Role.OPERATOR  # that token's role


@dataclass(frozen=True)
class Writes:
    """What a page needs to draw its forms: whether writes are on, the session, the path."""

    enabled: bool
    session: Session | None
    path: str

    def csrf(self, action: str) -> str:
        assert self.session is not None
        return csrf_token(self.session, action)

    def can(self, action: str) -> bool:
        """Whether the signed-in session's role may do ``action`` (a name of
        :data:`slotless.roles.NEEDS`): a page draws the forms of those it may, only."""
        return self.enabled and self.session is not None and self.session.role >= needs(action)


class Auth:
    def __init__(self, token: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._tokens = {t.secret.encode(): t for t in parse_tokens(token).values()}
        self._token = b"" if self._tokens else None  # writes are on when any token is set
        self._clock = clock
        self._sessions: dict[str, Session] = {}

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def token(self, given: str) -> Token | None:
        """The token ``given`` is (its name and role), or None; every token compared in
        constant time."""
        found = None
        for secret, token in self._tokens.items():
            if hmac.compare_digest(given.encode(), secret):
                found = token
        return found

    def who(self, given: str) -> str | None:
        """The name of the token ``given`` is, or None."""
        token = self.token(given)
        return token.name if token is not None else None

    def login(self, given: str) -> Session | None:
        """A new session when ``given`` is a token; None otherwise (or writes are off)."""
        token = self.token(given) if self._token is not None else None
        if token is None:
            return None
        now = self._clock()
        for sid in [s.id for s in self._sessions.values() if s.expires < now]:
            del self._sessions[sid]
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        session = Session(
            secrets.token_urlsafe(32),
            secrets.token_bytes(32),
            now + SESSION_TTL,
            who=token.name,
            role=token.role,
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
