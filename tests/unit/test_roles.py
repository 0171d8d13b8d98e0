"""Token roles (slotless/roles.py): the token list's forms, its refusals (one line naming
the entry, never the secret), the one table covering every write the page and the API
have, and what a session of each role may draw (``Writes.can``)."""

from __future__ import annotations

import pytest

from slotless.roles import NEEDS, Role, Token, TokenError, needs, parse_tokens, refusal
from slotless.web.actions import ACTIONS, ROUTE_ACTIONS
from slotless.web.api import ROUTES, openapi
from slotless.web.auth import Auth, Session, Writes


def test_the_three_forms_of_an_entry() -> None:
    tokens = parse_tokens("ada:admin:a1, olga:operator:o:with:colons,bob:b2 ,viv:VIEWER:v1")
    assert {n: (t.role, t.secret) for n, t in tokens.items()} == {
        "ada": (Role.ADMIN, "a1"),
        "olga": (Role.OPERATOR, "o:with:colons"),  # a secret with ':' after its role
        "bob": (Role.OPERATOR, "b2"),  # NAME:SECRET: an operator, as before roles
        "viv": (Role.VIEWER, "v1"),
    }
    assert parse_tokens("bare") == {"operator": Token("operator", Role.OPERATOR, "bare")}
    assert parse_tokens(None) == {} and parse_tokens(" , ") == {}
    assert "a1" not in repr(tokens["ada"])


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ok:admin:x,alice:r00t:SECRETPART", "token entry 2 (alice): the role"),
        ("alice:zq7:xk9", "token entry 1 (alice): the role"),  # an old secret with a colon
        ("alice:", "token entry 1 (alice): the secret is empty"),
        ("alice:admin:", "token entry 1 (alice): the secret is empty"),
        (":SECRETPART", "token entry 1: the name is empty"),
        ("a:SECRETPART,a:viewer:0th3r", "token entry 2 (a): the name is given twice"),
        ("a:SECRETPART,b:viewer:SECRETPART", "token entry 2 (b): its secret is another"),
    ],
)
def test_a_malformed_list_is_one_line_naming_the_entry_never_the_secret(
    text: str, says: str
) -> None:
    with pytest.raises(TokenError) as info:
        parse_tokens(text)
    line = str(info.value)
    assert line.startswith(says) and "\n" not in line
    for secret in ("SECRETPART", "zq7", "xk9", "r00t", "0th3r"):
        assert secret not in line


def test_one_table_names_every_page_action_and_every_api_write() -> None:
    for name in ACTIONS:
        assert name in NEEDS, f"page action {name!r} has no line in roles.NEEDS"
    for route, action in ROUTE_ACTIONS.items():
        assert action in NEEDS, f"page route {route} has no line in roles.NEEDS"
    for r in ROUTES:
        if r.write:
            assert r.action in NEEDS, f"{r.method} {r.path} has no line in roles.NEEDS"
    assert {a for a, role in NEEDS.items() if role == Role.ADMIN} >= {"pause", "unpause"}
    for op in ("trigger", "clear", "mark", "retry", "cancel", "resume", "respond"):
        assert needs(op) == Role.OPERATOR
    assert needs("something_new") == Role.ADMIN  # a write without its line is closed
    assert refusal("pause", "olga", Role.OPERATOR) == (
        "pause needs the admin role; olga is an operator"
    )
    doc = openapi()
    audit = doc["paths"]["/api/v1/audit"]["get"]
    assert audit["security"] == [{"bearer": []}] and "viewer" in audit["description"]
    start = doc["paths"]["/api/v1/dags/{dag_id}/runs"]["post"]
    assert "operator" in start["description"]
    assert "security" not in doc["paths"]["/api/v1/runs/{run_id}"]["get"]


def test_a_session_draws_only_the_forms_its_role_may_use() -> None:
    auth = Auth("viv:viewer:v,olga:operator:o,ada:admin:a")
    for secret, can in [
        ("v", {"logout", "audit"}),
        ("o", {"logout", "audit", "trigger", "clear", "respond"}),
        ("a", {"logout", "audit", "trigger", "clear", "respond", "pause", "unpause"}),
    ]:
        session = auth.login(secret)
        assert session is not None
        w = Writes(True, session, "/dags")
        allowed = {a for a in (*NEEDS, "pause", "trigger") if w.can(a)}
        assert allowed >= can and not (allowed - set(NEEDS))
        assert w.can("pause") == ("pause" in can) and w.can("trigger") == ("trigger" in can)
    assert not Writes(True, None, "/").can("audit")
    assert not Writes(False, Session("x", b"k", 0.0, role=Role.ADMIN), "/").can("pause")
    session = auth.login("a")
    assert session is not None and (session.who, session.role) == ("ada", Role.ADMIN)
    assert auth.who("o") == "olga" and auth.who("nope") is None
