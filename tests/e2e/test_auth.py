"""Principals over `/mcp` of `toolwarden serve`, with the official clients (docs/AUTH.md).

One `toolwarden serve` per test, in front of tw-test-server, with three token principals
(`[[auth.tokens]]`: `py-agent` and `ts-agent` from environment variables, `auditor` by its
SHA-256 with scope `read`) and an OAuth resource server (`[auth.oauth]`) whose issuer's JWKS is a
file the test writes: an RSA key made here (`cryptography`), whose access tokens the test signs
(`PyJWT`). The issuer is never contacted; its URL is only what `iss` and the metadata name.

- The official Python client (`mcp`) of either era, with `py-agent`'s token in an
  `Authorization` header (an `httpx2.AsyncClient` of its own, the SDK's documented way), and the
  official TypeScript v2 client (`@modelcontextprotocol/client`, `ts_auth_client.mjs`) of either
  era with `ts-agent`'s (`requestInit` headers), and the Python client with a JWT whose `sub` is
  `carol`: each call is in the audit trail as its principal's, on `GET /v1/audit` and
  `/v1/audit/calls` (read with the auditor's token, and `?principal=`) and in
  `toolwarden audit --principal`.
- No token: 401 with `WWW-Authenticate: Bearer resource_metadata="…"`, a URL of this server that
  serves RFC 9728 metadata naming the issuer and the resource (read with the Python SDK's own
  discovery helpers). A token that is not one of the server's — a random string, a JWT of another
  key, an expired one, one for another audience or issuer, an unsigned one — gets 401 too, and
  so does the official client that presents it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, Served, Setup, add_config, node_bin_dir, serve, text, toml_str, toolwarden_bin

pytestmark = pytest.mark.anyio

STATELESS = "2026-07-28"
ERAS = ["legacy", STATELESS]
ISSUER = "https://login.e2e.invalid/realms/agents"
AUDIENCE = "toolwarden-e2e"
TS_SCRIPT = Path(__file__).with_name("ts_auth_client.mjs")


@pytest.fixture
def anyio_backend():
    return "asyncio"


# --- the issuer: an RSA key, its JWKS, and access tokens it signs ---------------------------


class Issuer:
    """A signing key of the test's issuer (RS256, with a key id), and tokens it signs."""

    def __init__(self, kid: str):
        from cryptography.hazmat.primitives.asymmetric import rsa

        self.kid = kid
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwk(self) -> dict:
        from jwt.algorithms import RSAAlgorithm

        jwk = RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "alg": "RS256", "use": "sig"}

    def claims(self, sub: str, scope: str = "openid call", **overrides) -> dict:
        now = int(time.time())
        claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "scope": scope, "iat": now, "exp": now + 600}
        claims.update(overrides)
        return claims

    def sign(self, claims: dict) -> str:
        import jwt

        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})


def sha256_hex(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# --- the server ------------------------------------------------------------------------------


@dataclass
class Authed:
    served: Served
    setup: Setup
    issuer: Issuer
    tokens: dict[str, str]

    @property
    def url(self) -> str:
        return self.served.url

    @property
    def mcp(self) -> str:
        return self.served.url + "/mcp"


@contextlib.contextmanager
def authed_server(setup: Setup) -> Iterator[Authed]:
    """`toolwarden serve` with the three token principals and `[auth.oauth]` (a JWKS file)."""
    issuer = Issuer("e2e-key-1")
    (setup.dir / "jwks.json").write_text(json.dumps({"keys": [issuer.jwk()]}))
    tokens = {name: secrets.token_hex(32) for name in ("py-agent", "ts-agent", "auditor")}
    add_config(
        setup,
        "[[auth.tokens]]\n"
        'principal = "py-agent"\n'
        'token_env = "TW_E2E_PY_AGENT_TOKEN"\n'
        'scopes = ["call"]\n\n'
        "[[auth.tokens]]\n"
        'principal = "ts-agent"\n'
        'token_env = "TW_E2E_TS_AGENT_TOKEN"\n\n'
        "[[auth.tokens]]\n"
        'principal = "auditor"\n'
        f"token_sha256 = {toml_str(sha256_hex(tokens['auditor']))}\n"
        'scopes = ["read"]\n\n'
        "[auth.oauth]\n"
        f"issuer = {toml_str(ISSUER)}\n"
        f"audience = {toml_str(AUDIENCE)}\n"
        'jwks_file = "jwks.json"\n',
    )
    env = {
        **os.environ,
        "TW_E2E_PY_AGENT_TOKEN": tokens["py-agent"],
        "TW_E2E_TS_AGENT_TOKEN": tokens["ts-agent"],
    }
    with serve(setup.dir, setup.config, env=env) as served:
        served.wait_stderr(r'server "test" is up', 30)
        assert "warning: [auth.oauth]" not in served.stderr(), served.stderr()
        yield Authed(served, setup, issuer, tokens)


def http_client(token: str | None = None, seen: list | None = None):
    """An `httpx2.AsyncClient` (the SDK's HTTP client) that sends `token` as a bearer token, and
    records each response's method, status and `WWW-Authenticate` in `seen`."""
    import httpx2

    async def record(response) -> None:
        if seen is not None:
            request = response.request
            seen.append((request.method, response.status_code, response.headers.get("www-authenticate"), request.headers))

    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    return httpx2.AsyncClient(
        headers=headers, timeout=httpx2.Timeout(30, read=300), event_hooks={"response": [record]}
    )


@contextlib.asynccontextmanager
async def py_client(url: str, token: str | None, mode: str, seen: list | None = None) -> AsyncIterator:
    """The official Python client of `mode` at `url`, its requests carrying `token`."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with http_client(token, seen) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            yield client


async def py_echo(url: str, token: str, mode: str, said: str) -> None:
    seen: list = []
    async with py_client(url, token, mode, seen) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "test__echo" in names, names
        result = await client.call_tool("test__echo", {"text": said})
        assert not result.is_error, result
        assert text(result) == said
    # Every request carried the token and was let in (the handshake era's session GET and
    # DELETE too), in the era asked for.
    assert seen and all(h.get("authorization") == f"Bearer {token}" for *_, h in seen), seen
    assert all(status not in (401, 403, 404) for _, status, _, _ in seen), seen
    posts = [h for method, _, _, h in seen if method == "POST"]
    if mode == STATELESS:
        assert all(h.get("mcp-protocol-version") == STATELESS and "mcp-session-id" not in h for h in posts), posts
    else:
        assert all("mcp-session-id" in h for h in posts[1:]), posts


def ts_echo(url: str, token: str, mode: str, said: str) -> dict:
    node = node_bin_dir() / "node"
    done = subprocess.run(
        [str(node), str(TS_SCRIPT), mode, url, token, said],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert "test__echo" in seen["tools"], seen
    assert seen["isError"] is False, seen
    assert seen["text"] == said, seen
    assert seen["outcome"]["status"] == "ok", seen
    return seen


async def get_json(url: str, token: str) -> dict:
    async with http_client(token) as http:
        response = await http.get(url)
    assert response.status_code == 200, (url, response.status_code, response.text)
    return response.json()


def result_text(call: dict) -> str | None:
    """The text of a call's `tool_result` event in `/v1/audit/calls`' JSON."""
    for event in call.get("events", []):
        if event.get("type") == "tool_result":
            return "\n".join(block.get("text", "") for block in event.get("content", []))
    return None


# --- attribution -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_each_clients_calls_are_its_principals_in_the_audit_trail(setup: Setup, mode: str):
    said = {
        "py-agent": f"from the python client ({mode})",
        "ts-agent": f"from the typescript client ({mode})",
        "carol": f"from carol's access token ({mode})",
    }
    with authed_server(setup) as server:
        await py_echo(server.mcp, server.tokens["py-agent"], mode, said["py-agent"])
        ts_echo(server.mcp, server.tokens["ts-agent"], mode, said["ts-agent"])
        carol = server.issuer.sign(server.issuer.claims("carol"))
        await py_echo(server.mcp, carol, mode, said["carol"])

        # The auditor (`read`) sees every principal's calls, each attributed to its principal.
        calls = (await get_json(f"{server.url}/v1/audit/calls?tool=test__echo", server.tokens["auditor"]))["calls"]
        who = sorted((call["principal"], result_text(call)) for call in calls)
        assert who == sorted(said.items()), calls

        # `?principal=` keeps that principal's records; every event of them names it.
        for name, text_said in said.items():
            only = (await get_json(f"{server.url}/v1/audit/calls?principal={name}", server.tokens["auditor"]))["calls"]
            assert [(c["principal"], result_text(c)) for c in only] == [(name, text_said)], only
            events = (await get_json(f"{server.url}/v1/audit?principal={name}", server.tokens["auditor"]))["events"]
            assert {e["type"] for e in events} >= {"turn_start", "tool_start", "tool_result", "turn_end"}, events
            assert all(e["principal"] == name for e in events), events

        # A principal without `read` sees its own calls only.
        own = (await get_json(f"{server.url}/v1/audit/calls", server.tokens["py-agent"]))["calls"]
        assert [(c["principal"], result_text(c)) for c in own] == [("py-agent", said["py-agent"])], own

    # The same trail, read from the store by the CLI after the server stopped.
    for name, text_said in said.items():
        done = subprocess.run(
            [str(toolwarden_bin()), "audit", "--config", str(setup.config), "--principal", name, "--json"],
            cwd=setup.dir,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        assert [(r["principal"], r["tool"], result_text(r)) for r in rows] == [(name, "test__echo", text_said)], rows


# --- discovery and refusals ------------------------------------------------------------------


async def test_without_a_token_the_401_points_at_metadata_naming_the_issuer_and_the_resource(setup: Setup):
    from mcp.client.auth.utils import extract_resource_metadata_from_www_auth
    from mcp.shared.auth import ProtectedResourceMetadata
    from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url

    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "e2e", "version": "0"},
        },
    }
    mcp_headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    with authed_server(setup) as server:
        expected_metadata_url = f"{server.url}/.well-known/oauth-protected-resource/mcp"
        async with http_client() as http:
            response = await http.post(server.mcp, json=initialize, headers=mcp_headers)
            assert response.status_code == 401, response.text
            challenge = response.headers["www-authenticate"]
            assert challenge.startswith("Bearer "), challenge
            assert "error=" not in challenge, challenge  # no token was presented, none refused
            assert extract_resource_metadata_from_www_auth(response) == expected_metadata_url, challenge

            # The REST API is behind the same door.
            response = await http.get(f"{server.url}/v1/audit")
            assert response.status_code == 401, response.text
            assert extract_resource_metadata_from_www_auth(response) == expected_metadata_url

            # The metadata, open to everyone, at the URL the challenge named and at the root.
            documents = []
            for url in (expected_metadata_url, f"{server.url}/.well-known/oauth-protected-resource"):
                response = await http.get(url)
                assert response.status_code == 200, (url, response.text)
                assert response.headers["content-type"].startswith("application/json"), response.headers
                documents.append(response.json())
        assert documents[0] == documents[1], documents
        metadata = ProtectedResourceMetadata.model_validate(documents[0])
        assert [str(s).rstrip("/") for s in metadata.authorization_servers] == [ISSUER], documents[0]
        assert str(metadata.resource) == server.mcp, documents[0]
        assert documents[0]["resource"] == server.mcp, documents[0]
        assert check_resource_allowed(
            requested_resource=resource_url_from_server_url(server.mcp), configured_resource=str(metadata.resource)
        )
        assert {"call", "read"} <= set(metadata.scopes_supported or []), documents[0]
        assert metadata.bearer_methods_supported == ["header"], documents[0]


def unsigned(claims: dict) -> str:
    def b64(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}."


async def test_a_token_that_is_not_the_servers_gets_401(setup: Setup):
    from mcp.client.auth.utils import extract_field_from_www_auth, extract_resource_metadata_from_www_auth

    with authed_server(setup) as server:
        issuer = server.issuer
        stranger = Issuer(issuer.kid)  # another key under the issuer's key id
        now = int(time.time())
        refused = {
            "random": secrets.token_hex(32),
            "a token principal's token, altered": server.tokens["py-agent"][:-1]
            + ("0" if server.tokens["py-agent"][-1] != "0" else "1"),
            "signed by another key": stranger.sign(issuer.claims("mallory")),
            "expired": issuer.sign(issuer.claims("carol", iat=now - 7200, exp=now - 3600)),
            "for another audience": issuer.sign(issuer.claims("carol", aud="another-service")),
            "of another issuer": issuer.sign(issuer.claims("carol", iss="https://login.e2e.invalid/realms/other")),
            "unsigned (alg none)": unsigned(issuer.claims("carol")),
        }
        async with http_client() as http:
            for what, token in refused.items():
                response = await http.get(f"{server.url}/v1/me", headers={"Authorization": f"Bearer {token}"})
                assert response.status_code == 401, (what, response.status_code, response.text)
                assert extract_field_from_www_auth(response, "error") == "invalid_token", (
                    what,
                    response.headers.get("www-authenticate"),
                )
                assert extract_resource_metadata_from_www_auth(response) == (
                    f"{server.url}/.well-known/oauth-protected-resource/mcp"
                ), what
            # The issuer's own, valid token is accepted by the same door.
            good = await http.get(
                f"{server.url}/v1/me", headers={"Authorization": f"Bearer {issuer.sign(issuer.claims('carol'))}"}
            )
            assert good.status_code == 200, good.text
            assert good.json()["principal"] == "carol", good.json()

        # The official Python client of each era, with no token or a refused one, does not get
        # in: its first request is answered 401 with the challenge, and it gives up (this SDK
        # surfaces the 401 as an error; without an OAuth provider it cannot get a token).
        for mode in ERAS:
            for token in (None, refused["random"], refused["expired"]):
                seen: list = []
                with pytest.raises(Exception):  # noqa: B017, PT011 (an MCPError in an ExceptionGroup)
                    async with py_client(server.mcp, token, mode, seen) as client:
                        await client.call_tool("test__echo", {"text": "must not run"})
                assert seen, mode
                assert all(status == 401 for _, status, _, _ in seen), (mode, token, seen)
                assert all("resource_metadata=" in (challenge or "") for _, _, challenge, _ in seen), seen

        # Nothing ran.
        calls = (await get_json(f"{server.url}/v1/audit/calls", server.tokens["auditor"]))["calls"]
        assert calls == [], calls
