"""The run's keys and the join token.

Node 0 generates, per run, a CURVE server keypair and a client keypair. The token hands a node
what it needs and nothing more: the address of node 0's join service, the server's *public*
key (the node can tell it talks to the right ddptui) and the run's client secret key (node 0's
ZAP handler admits only that client's public key). The server's secret key stays in node 0's
memory: it is never printed, logged or written.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

import zmq

from ddptui.run.cluster.addresses import split_endpoint

TOKEN_PREFIX = "ddp1."
MAX_TOKEN_CHARS = 1024
_Z85_KEY_CHARS = 40


class TokenError(ValueError):
    """A token that is not one ``ddptui`` printed (one line, for the user)."""


@dataclass(frozen=True)
class RunKeys:
    """A run's CURVE keys (z85 bytes). ``server_secret`` is only ever held by node 0."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def generate(cls) -> RunKeys:
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public, server_secret, client_public, client_secret)

    def __repr__(self) -> str:  # never show a secret in a traceback or a log
        return f"RunKeys(server_public={self.server_public.decode()!r}, …)"


@dataclass(frozen=True)
class JoinToken:
    """What ``ddptui join TOKEN`` carries: where to ask, whom to trust, how to prove itself."""

    endpoint: str  # HOST:PORT of node 0's join service
    server_public: bytes
    client_secret: bytes

    @property
    def client_public(self) -> bytes:
        return zmq.curve_public(self.client_secret)

    def encode(self) -> str:
        body = json.dumps(
            {
                "e": self.endpoint,
                "k": self.server_public.decode(),
                "c": self.client_secret.decode(),
            },
            separators=(",", ":"),
        ).encode()
        return TOKEN_PREFIX + base64.urlsafe_b64encode(body).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> JoinToken:
        value = text.strip()
        if not value.startswith(TOKEN_PREFIX) or len(value) > MAX_TOKEN_CHARS:
            raise TokenError("not a ddptui join token (copy the whole 'ddptui join' line)")
        body = value[len(TOKEN_PREFIX) :]
        try:
            data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            endpoint, server, client = data["e"], data["k"], data["c"]
        except (binascii.Error, ValueError, TypeError, KeyError):
            raise TokenError(
                "the join token is damaged (copy the whole 'ddptui join' line)"
            ) from None
        if not all(isinstance(v, str) for v in (endpoint, server, client)):
            raise TokenError("the join token is damaged (copy the whole 'ddptui join' line)")
        if len(server) != _Z85_KEY_CHARS or len(client) != _Z85_KEY_CHARS:
            raise TokenError("the join token holds no valid keys (copy the whole line)")
        try:
            split_endpoint(endpoint)
            zmq.curve_public(client.encode())
        except (ValueError, zmq.ZMQError) as exc:
            raise TokenError(f"the join token is damaged: {exc}") from None
        return cls(endpoint, server.encode(), client.encode())
