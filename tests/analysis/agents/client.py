"""A real MCP client session against the real `otel-titan mcp`: the SDK's own stdio client, the
server a subprocess."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.conftest import REPO


class Session:
    """One client session: tool calls answered as the parsed JSON document (or the error text), and
    how long each took."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session
        self.seconds: dict[str, float] = {}

    async def tools(self) -> dict[str, Any]:
        return {tool.name: tool for tool in (await self.session.list_tools()).tools}

    async def call(self, name: str, **arguments: Any) -> dict[str, Any]:
        """The tool's answer, parsed; AssertionError when it is an error result."""
        result = await self.raw(name, **arguments)
        assert not result.is_error, result.content[0].text
        assert len(result.content) == 1 and result.content[0].type == "text"
        return json.loads(result.content[0].text)

    async def raw(self, name: str, **arguments: Any) -> Any:
        started = time.monotonic()
        result = await self.session.call_tool(name, arguments)
        self.seconds[name] = time.monotonic() - started
        return result

    async def resource(self, uri: str) -> str:
        return (await self.session.read_resource(uri)).contents[0].text


@asynccontextmanager
async def mcp_session(*folders: str, extra: tuple[str, ...] = ()) -> AsyncIterator[Session]:
    """`otel-titan mcp FOLDER ...` started by the SDK's stdio client, initialized."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "otel_titan.cli", "mcp", *extra, *folders],
        cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield Session(session)


def run_session(folders: list[str], body: Callable[[Session], Awaitable[Any]]) -> Any:
    """Run `body` in a session against the server of `folders`; returns what it returns."""

    async def main() -> Any:
        async with mcp_session(*folders) as session:
            return await body(session)

    return anyio.run(main)
