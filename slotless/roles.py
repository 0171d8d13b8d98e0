"""Who may do what through the web page and the JSON API: the tokens' roles, and the one
table of the role each write needs.

A token is configured (``slotless ui --token``, ``slotless up --token`` or
$SLOTLESS_UI_TOKEN) as a comma-separated list of entries, each one of::

    NAME:ROLE:SECRET   e.g. alice:admin:9f3...   (ROLE: viewer, operator or admin)
    NAME:SECRET        an operator named NAME    (as before roles existed)
    SECRET             an operator named "operator"

A secret holding ``:`` must be written with its role (``ci:operator:a:b``): otherwise
what is before its first colon would be read as a role. A malformed list is refused when
the page starts (:class:`TokenError`: one line naming the entry's position and, when it
has one, its name; never the secret).

This module imports nothing heavy: ``slotless up`` checks the list before it starts its
processes, and the CLI parses it without loading the web server.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(enum.IntEnum):
    """A token's role; each includes what the ones below it may do."""

    VIEWER = 1  # reads, and signs in (the audit list needs a token)
    OPERATOR = 2  # runs: trigger, clear, mark, retry, cancel, resume; answers; events
    ADMIN = 3  # DAGs and pools: pause, unpause, pools and queues

    def __str__(self) -> str:
        return self.name.lower()

    @property
    def article(self) -> str:
        """ "a viewer", "an operator", "an admin": for the one line a refusal is."""
        return f"{'an' if self.name[0] in 'AEIOU' else 'a'} {self}"


ROLES = {str(r): r for r in Role}

# The ONE table: the role every write (and every read that needs a token) requires, by
# action name. A page action is ``POST /actions/<name>``; an API route names its action
# (``route(..., action=...)``); the audit list records the same names. A name missing
# here needs ADMIN (:func:`needs`), so that a write added without a line here is closed,
# not open; a test checks that every registered action and write route has its line.
NEEDS: dict[str, Role] = {
    # reads that need a signed-in token (every other read is open, as without roles)
    "audit": Role.VIEWER,  # GET /audit, GET /api/v1/audit: who did what
    "logout": Role.VIEWER,  # POST /logout
    # runs (the page's forms; the API's POST /dags/{dag_id}/runs is "trigger")
    "trigger": Role.OPERATOR,
    "clear": Role.OPERATOR,
    "mark": Role.OPERATOR,
    "retry": Role.OPERATOR,
    "cancel": Role.OPERATOR,
    "resume": Role.OPERATOR,
    # people's requests (the page's Needs-you forms, POST .../tasks/{task_id}/response)
    "respond": Role.OPERATOR,
    # events (POST /api/v1/events)
    "send_events": Role.OPERATOR,
    # asset events (POST /api/v1/assets/events): like an event, they may start runs
    "send_asset_event": Role.OPERATOR,
    # DAGs and pools
    "pause": Role.ADMIN,
    "unpause": Role.ADMIN,
    "pool_set": Role.ADMIN,
    "pool_delete": Role.ADMIN,
    "queue_add": Role.ADMIN,
    "queue_delete": Role.ADMIN,
}


def needs(action: str) -> Role:
    """The role ``action`` requires; ADMIN for an action the table does not name."""
    return NEEDS.get(action, Role.ADMIN)


def refusal(action: str, name: str, role: Role) -> str:
    """The one line a refused write is: the role needed and the token's role."""
    return f"{action} needs the {needs(action)} role; {name} is {role.article}"


class TokenError(ValueError):
    """A malformed token list: one line naming the entry (its position and name)."""


@dataclass(frozen=True)
class Token:
    name: str
    role: Role
    secret: str

    def __repr__(self) -> str:  # never the secret, in a log or a traceback
        return f"Token({self.name!r}, {self.role})"


def parse_tokens(text: str | None) -> dict[str, Token]:
    """``"alice:admin:s3cret,bob:0ther"`` -> {name: Token}; see the module for the forms.

    :class:`TokenError` for an empty name or secret, a name or a secret given twice, a
    role that is none of viewer, operator, admin; its message names the entry's position
    and name."""
    tokens: dict[str, Token] = {}
    for i, entry in enumerate((e.strip() for e in (text or "").split(",")), start=1):
        if not entry:
            continue
        parts = entry.split(":", 2)
        if len(parts) == 1:
            name, role, secret = "operator", Role.OPERATOR, entry
        elif len(parts) == 2:
            name, role, secret = parts[0].strip(), Role.OPERATOR, parts[1]
        else:
            name, secret = parts[0].strip(), parts[2]
            found = ROLES.get(parts[1].strip().lower())
            if found is None:
                # The bad "role" is not shown: in an old NAME:SECRET entry whose secret
                # holds a colon it is the secret's first part.
                raise TokenError(
                    f"token entry {i} ({_shown(name)}): the role (NAME:ROLE:SECRET) must be "
                    "viewer, operator or admin; a secret holding ':' needs its role before it"
                )
            role = found
        where = f"token entry {i} ({_shown(name)})" if name else f"token entry {i}"
        if not name:
            raise TokenError(f"{where}: the name is empty (expected NAME:ROLE:SECRET)")
        if not secret:
            raise TokenError(f"{where}: the secret is empty (expected NAME:ROLE:SECRET)")
        if name in tokens:
            raise TokenError(f"{where}: the name is given twice; names must be unique")
        if any(t.secret == secret for t in tokens.values()):
            # Which name would a write be recorded under? Neither is shown the other's.
            raise TokenError(f"{where}: its secret is another entry's; secrets must differ")
        tokens[name] = Token(name, role, secret)
    return tokens


def _shown(name: str) -> str:
    return name if len(name) <= 60 and name.isprintable() else repr(name[:60])
