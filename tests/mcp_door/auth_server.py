"""A real OAuth 2.1 authorization server for the MCP door's tests, on joserfc (keys, JWTs) and
the standard library's HTTP server.

    auth_server.py <port>

It serves, at http://127.0.0.1:<port>:

- `/.well-known/oauth-authorization-server`: its metadata (RFC 8414);
- `/authorize`: refused, `unsupported_response_type` (no browser flow here);
- `/jwks`: the public half of its signing keys (RSA, RS256), each with a `kid`;
- `POST /token`: the client_credentials grant (client_secret_basic or client_secret_post); the
  access token is a JWT with `iss`, `sub` (the client), `aud` (the `resource` parameter, RFC
  8707), `iat`, `nbf`, `exp` (5 minutes), `scope` and `org` (the client's tenant);

and, for the tests to drive it:

- `POST /mint`: a token with the claims the JSON body overrides (`aud`, `exp_in`, `nbf_in`,
  `scope`, `org`, `iss`, `sub`) and `"key": "unknown"` to sign it with a key the JWKS never lists;
- `POST /rotate`: a new signing key, the only one the JWKS lists from then on;
- `GET /stats`: how many times the JWKS was fetched.

Prints `READY` once it listens.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

CLIENTS = {
    "agent-acme": {"secret": "acme-secret-0123456789", "org": "acme", "scope": "tools:call"},
    "agent-beta": {"secret": "beta-secret-0123456789", "org": "beta", "scope": "tools:call"},
    "agent-noscope": {"secret": "none-secret-0123456789", "org": "acme", "scope": "profile"},
}


class Issuer:
    def __init__(self, base: str) -> None:
        self.base = base
        self.lock = threading.Lock()
        self.generation = 0
        self.current = self.new_key()
        self.stranger = RSAKey.generate_key(2048, parameters={"kid": "never-published"})
        self.jwks_fetches = 0

    def new_key(self) -> RSAKey:
        self.generation += 1
        return RSAKey.generate_key(2048, parameters={"kid": f"key-{self.generation}", "use": "sig", "alg": "RS256"})

    def jwks(self) -> dict[str, Any]:
        with self.lock:
            self.jwks_fetches += 1
            return KeySet([self.current]).as_dict(private=False)

    def rotate(self) -> str:
        with self.lock:
            self.current = self.new_key()
            return self.current.kid

    def token(self, overrides: dict[str, Any]) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.base,
            "sub": overrides.get("sub", "tester"),
            "aud": overrides.get("aud"),
            "iat": now,
            "nbf": now + int(overrides.get("nbf_in", 0)),
            "exp": now + int(overrides.get("exp_in", 300)),
            "scope": overrides.get("scope", "tools:call"),
            "org": overrides.get("org", "acme"),
        }
        if "iss" in overrides:
            claims["iss"] = overrides["iss"]
        claims = {name: value for name, value in claims.items() if value is not None}
        with self.lock:
            key = self.stranger if overrides.get("key") == "unknown" else self.current
        return jwt.encode({"alg": "RS256", "kid": key.kid, "typ": "at+jwt"}, claims, key)


class Handler(BaseHTTPRequestHandler):
    issuer: Issuer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        sys.stderr.write("auth_server: " + format % args + "\n")

    def answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("cache-control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        base = self.issuer.base
        if self.path == "/.well-known/oauth-authorization-server":
            self.answer(
                200,
                {
                    "issuer": base,
                    # Listed because clients require it (RFC 8414 does when a grant uses it);
                    # this server grants client_credentials only, so it answers every
                    # authorization request unsupported_response_type.
                    "authorization_endpoint": f"{base}/authorize",
                    "token_endpoint": f"{base}/token",
                    "jwks_uri": f"{base}/jwks",
                    "grant_types_supported": ["client_credentials"],
                    "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
                    "response_types_supported": ["code"],
                    "scopes_supported": ["tools:call", "profile"],
                },
            )
        elif self.path == "/jwks":
            self.answer(200, self.issuer.jwks())
        elif self.path.startswith("/authorize"):
            self.answer(400, {"error": "unsupported_response_type"})
        elif self.path == "/stats":
            self.answer(200, {"jwks_fetches": self.issuer.jwks_fetches})
        else:
            self.answer(404, {"error": "not_found"})

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        if self.path == "/token":
            self.grant(parse_qs(self.body().decode()))
        elif self.path == "/mint":
            self.answer(200, {"access_token": self.issuer.token(json.loads(self.body() or b"{}"))})
        elif self.path == "/rotate":
            self.answer(200, {"kid": self.issuer.rotate()})
        else:
            self.answer(404, {"error": "not_found"})

    def grant(self, form: dict[str, list[str]]) -> None:
        field = lambda name: (form.get(name) or [None])[0]  # noqa: E731
        client_id, secret = field("client_id"), field("client_secret")
        basic = self.headers.get("authorization", "")
        if basic.lower().startswith("basic "):
            from urllib.parse import unquote

            client_id, _, secret = base64.b64decode(basic[6:]).decode().partition(":")
            client_id, secret = unquote(client_id), unquote(secret)
        client = CLIENTS.get(client_id or "")
        if field("grant_type") != "client_credentials":
            self.answer(400, {"error": "unsupported_grant_type"})
            return
        if client is None or client["secret"] != secret:
            self.answer(401, {"error": "invalid_client"})
            return
        resource = field("resource")
        token = self.issuer.token({"sub": client_id, "aud": resource, "scope": client["scope"], "org": client["org"]})
        self.answer(
            200, {"access_token": token, "token_type": "Bearer", "expires_in": 300, "scope": client["scope"]}
        )


def main() -> None:
    port = int(sys.argv[1])
    Handler.issuer = Issuer(f"http://127.0.0.1:{port}")
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("READY", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
