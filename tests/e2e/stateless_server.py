"""A real MCP server of the current revision for the end-to-end tests: the official Python SDK's
`MCPServer` (mcp 2.3) on stdio. The SDK serves either era, in the one the client opens with;
toolwarden opens with `server/discover`, so it is spoken to in 2026-07-28 (no `initialize`, a
`_meta` envelope on every request), which `era` shows.

Tools: `era` (the protocol version of the request), `greet {name}` (asks the client's user for a
greeting word through elicitation, which 2026-07-28 carries as `input_required`), and
`slow {seconds}` (sleeps, reporting progress every 0.1 s).
"""

from __future__ import annotations

from typing import Annotated

import anyio
from pydantic import BaseModel

from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve

server = MCPServer("py-2026")


class Word(BaseModel):
    word: str


def ask_word(name: str) -> Elicit[Word]:
    return Elicit(f"How should {name} be greeted?", Word)


@server.tool()
def era(ctx: Context) -> str:
    """The protocol version this request speaks."""
    return ctx.protocol_version or ""


@server.tool()
def greet(name: str, word: Annotated[Word, Resolve(ask_word)]) -> str:
    """Greets `name` with a word the client's user chooses."""
    return f"{word.word}, {name}!"


@server.tool()
async def slow(seconds: float, ctx: Context) -> str:
    """Sleeps, reporting progress every 0.1 s."""
    steps = max(1, int(seconds * 10))
    for i in range(steps):
        await anyio.sleep(0.1)
        await ctx.report_progress(i + 1, steps)
    return "slept"


if __name__ == "__main__":
    server.run("stdio")
