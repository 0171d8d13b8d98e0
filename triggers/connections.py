"""Connections named by id and resolved from the environment, never from the database.

``SLOTLESS_CONN_<ID>`` holds a URI, e.g. ``s3://KEY:SECRET@?endpoint_url=http://127.0.0.1:9000``
or ``sftp://user:pw@host:2222?key_file=/keys/id_ed25519``. The id is upper-cased and
``-`` becomes ``_``. Secrets are kept out of ``repr`` and out of every log line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit


class UnknownConnection(LookupError):
    """No ``SLOTLESS_CONN_<ID>`` for this id in the process's environment."""


@dataclass(frozen=True)
class Connection:
    conn_id: str
    scheme: str
    host: str | None = None
    port: int | None = None
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    path: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def redacted(self) -> str:
        """The URI with the password and any secret-looking extras replaced by ***."""
        auth = ""
        if self.login:
            auth = self.login + (":***" if self.password else "") + "@"
        host = (self.host or "") + (f":{self.port}" if self.port else "")
        extras = "&".join(
            f"{k}={'***' if _secret(k) else v}" for k, v in sorted(self.extra.items())
        )
        return f"{self.scheme}://{auth}{host}{self.path}" + (f"?{extras}" if extras else "")


def _secret(key: str) -> bool:
    k = key.lower()
    return any(s in k for s in ("secret", "password", "token", "passphrase", "key_data"))


def env_name(conn_id: str) -> str:
    return "SLOTLESS_CONN_" + conn_id.upper().replace("-", "_")


def get_connection(conn_id: str, environ: dict[str, str] | None = None) -> Connection:
    env = os.environ if environ is None else environ
    uri = env.get(env_name(conn_id))
    if uri is None:
        raise UnknownConnection(
            f"unknown connection id {conn_id!r}: set {env_name(conn_id)} in the environment "
            "of the triggerer (and of workers running poke or reschedule sensors)"
        )
    return parse_connection(conn_id, uri)


def parse_connection(conn_id: str, uri: str) -> Connection:
    parts = urlsplit(uri)
    return Connection(
        conn_id=conn_id,
        scheme=parts.scheme,
        host=parts.hostname,
        port=parts.port,
        login=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        path=parts.path,
        extra=dict(parse_qsl(parts.query)),
    )
