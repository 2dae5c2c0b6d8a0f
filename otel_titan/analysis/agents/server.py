"""`otel-titan mcp`: the run's questions as Model Context Protocol tools, on the official SDK (PyPI
``mcp``), over stdio or loopback HTTP.

The SDK (`mcp.server.mcpserver.MCPServer`) does the protocol: the
handshake, each tool's JSON schema (from the signatures and `Field`
descriptions below), running a tool in a worker thread, an exception as an
``isError`` result (the server goes on). The answers are `tools.Tools`'s;
this module only names the tools, describes them for a model, and serves the
guide and the record schema as resources. Imported by the ``mcp`` command
alone (the SDK is an optional extra: ``pip install 'otel-titan[mcp]'``).
"""

# No `from __future__ import annotations`: the tools' annotations are evaluated where they are
# defined, with the SDK's `Field` imported inside `build_server` (the SDK reads them to make each
# tool's JSON schema).

import hmac
import socket
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Annotated, Any

import orjson

from otel_titan._version import __version__
from otel_titan.analysis.agents.budget import DEFAULT_TOKENS, MAX_TOKENS, Budget
from otel_titan.analysis.agents.tools import (
    DATA_NOTE,
    SQL_DEFAULT_ROWS,
    SQL_MAX_ROWS,
    ToolInputError,
    Tools,
    schema_resource,
)
from otel_titan.analysis.query.sql import VIEW_HELP, MissingDependencyError
from otel_titan.analysis.read.records import NoRecordsError, NotARunError
from otel_titan.analysis.read.safe_text import json_bytes

__all__ = [
    "GUIDE_URI",
    "SCHEMA_URI",
    "build_server",
    "guide_text",
    "require_sdk",
    "serve",
    "serve_http",
    "INSTALL_HINT",
]

INSTALL_HINT = "pip install 'otel-titan[mcp]'"
GUIDE_URI = "otel-titan://guide"
SCHEMA_URI = "otel-titan://schema"

#: Failures that are the caller's to fix (a path, a rank, a query): their message goes back as the
#: tool's error.
_EXPECTED = (
    ToolInputError,
    NotARunError,
    NoRecordsError,
    MissingDependencyError,
    FileNotFoundError,
    PermissionError,
)


def require_sdk() -> None:
    """Import the MCP SDK, or raise `MissingDependencyError` naming the extra to install."""
    try:
        import mcp.server.mcpserver  # noqa: F401 - optional
    except ImportError as error:
        raise MissingDependencyError(
            f"`otel-titan mcp` needs the MCP Python SDK, which is not installed: {INSTALL_HINT} "
            "(or pip install mcp)"
        ) from error


def guide_text() -> str:
    """The guide for agents shipped in the package (``agents/guide.md``): when to call which tool,
    how to read a verdict."""
    return (
        resources.files("otel_titan.analysis.agents")
        .joinpath("guide.md")
        .read_text(encoding="utf-8")
    )


_RUN = "The run: a run folder (holding structured_logs/), its structured_logs/ folder or one .jsonl file, absolute or relative to a folder this server serves (list_runs gives them)."
_RUN_ID = (
    "Which run when the folder holds several (list_runs gives their run_id); default: the latest."
)
_BUDGET = f"The most tokens this answer may take (default {DEFAULT_TOKENS}, at most {MAX_TOKENS}); lists are cut to fit and the cuts listed in budget.omitted."
_RANKS = "Only these ranks, e.g. '0,3,8-11'."
_STEPS = "Only steps A to B, both included: 'A:B', 'A:', ':B' or 'N'."

DESCRIPTIONS = {
    "list_runs": "List the training runs in a folder this server serves: each with its path (`run`), run_id, processes, ranks (as ranges), "
    "sources, restart attempts, size in bytes, last step reached, how many processes are in each "
    "state (closed, running, stalled, crashed, "
    "terminated, hung before first record) read from the ends of the files, and age (seconds "
    "since the last record). Call it first when you "
    "do not know the run's path, then call diagnose on the run to look at.",
    "diagnose": "The first question to ask of a run that hung, crashed, was killed or is slow: the diagnosis of `otel-titan summarize --json`. "
    "`data.headline.diagnosis` lists what to look at first, most telling first (missing ranks, "
    "hang suspects with the rule that named them, "
    "crashed ranks, the group that differs, stragglers with their cost); `headline.groups` groups "
    "processes that stopped alike (count and "
    "ranks as ranges, never a row per rank); `hang` has the verdict ('named', or 'cannot tell' "
    "with the reason in notes), suspects with "
    "evidence and the culprit's place; `stragglers` are findings with verdict ('straggler', "
    "'difference', 'cannot tell') and cost per step. "
    "Follow `next`: process() for a suspect's black box, compare() for a straggler, "
    "steps()/export() for the steps around it.",
    "process": "One rank's process in detail: its facts as `summarize --json` has them (state, last step and relative step, last event and "
    "when, open spans outermost first with how long they have been open, clean close or signal, "
    "records lost), its place in the hang "
    "(where it is stuck, the collective and process group from the flight recorder, each thread's "
    "stack from its black box), whether it "
    "is a hang suspect and why, and its last records as written (newest last). Use it on the rank "
    "diagnose names.",
    "steps": "The step table, or a window of it: one row per rank and step with the step time (ms, from the step's first record to the "
    "next step's), each phase's count and total ms ({name: [count, ms]}) and the step-closing "
    "span's enter and exit time (µs, the rank's "
    "own clock). Narrow it with ranks and steps; a long table comes in pages: pass next_cursor "
    "back as cursor for the next.",
    "compare": "One rank against its peers (by default the peers the straggler rule compared it with, else every rank of its source and "
    "attempt): per phase and for the whole step, the rank's median ms per step beside the median "
    "of its peers' medians (facts from the "
    "step table), and the straggler rule's own findings on this rank with verdict and cost. Use "
    "it to see where a named straggler loses its time.",
    "sql": "Answer a question the other tools do not with one read-only SQL SELECT (DuckDB) over the run's views, times in µs since the epoch "
    "aligned across hosts: "
    + "; ".join(f"{name}: {text}" for name, text in VIEW_HELP.items())
    + ". The database holds only this run: no file, "
    "URL or extension can be reached and nothing can be written. At most max_rows rows (default "
    f"{SQL_DEFAULT_ROWS}, at most {SQL_MAX_ROWS}) "
    "and the token budget come back; more_rows says the query had more: aggregate or add WHERE / "
    "LIMIT. Example: SELECT rank, "
    "quantile_cont(duration_ms, 0.99) AS p99_ms FROM spans WHERE name = 'fwd' GROUP BY rank ORDER "
    "BY p99_ms DESC LIMIT 5.",
    "live": "For a job that is running now: one refresh of `otel-titan watch` (the same detector), reading only what was written since the "
    "previous call: states, steps, step time, the phases' share, and the alerts active now (hang, "
    "crashed, terminated, missing, slow) with "
    "the culprit, evidence and cost, plus the events (raised, updated, resolved) since the last "
    "call. A hang is confirmed over refreshes "
    "after hang_after_s of silence: poll every few seconds. On a suspected hang it touches the "
    "run's dump trigger file, as watch does, so "
    "that every rank writes its black box (request_black_boxes=false: never).",
    "export": "Write a Perfetto trace of the run, or of some ranks and steps (the slice to look at after diagnose), as `otel-titan export` "
    "does: one track per rank, a bar per span, spans that never ended kept as unfinished bars. "
    "Returns the file's path (on the machine "
    "this server runs on, beside the run in analysis/) and what it holds; open it in "
    "https://ui.perfetto.dev. native=true writes "
    "Perfetto's protobuf format, smaller, for big slices.",
}


def build_server(folders: list[str], *, cache: bool = True) -> Any:
    """The MCP server of the runs under `folders`: the tools of `tools.TOOL_NAMES`, the guide and
    the schema as resources."""
    require_sdk()
    from mcp.server.mcpserver import MCPServer  # optional
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations
    from pydantic import Field  # the SDK's own dependency

    answers = Tools(folders, cache=cache)
    server = MCPServer(
        name="otel-titan",
        version=__version__,
        log_level="WARNING",  # the SDK's own INFO lines (a session started) are noise on the client's stderr
        instructions="Tools over otel-titan training runs (per-rank structured logs): start with list_runs, then diagnose; read the guide "
        f"resource {GUIDE_URI} for when to call which tool and how to read a verdict. {DATA_NOTE}",
    )

    def answer(call: Callable[[], dict[str, Any]]) -> str:
        try:
            return json_bytes(call(), option=orjson.OPT_NON_STR_KEYS).decode()
        except _EXPECTED as error:
            raise ToolError(str(error)) from error

    read_only = ToolAnnotations(readOnlyHint=True, openWorldHint=False)  # type: ignore[call-arg]  # the MCP names (pydantic aliases), as the protocol spells them

    @server.tool(
        description=DESCRIPTIONS["list_runs"], annotations=read_only, structured_output=False
    )
    def list_runs(
        folder: Annotated[
            str | None,
            Field(
                description="A folder this server serves, or one inside it; default: the first served folder."
            ),
        ] = None,
        cursor: Annotated[
            str | None, Field(description="next_cursor of the previous answer, for the next page.")
        ] = None,
        budget_tokens: Annotated[int | None, Field(description=_BUDGET)] = None,
    ) -> str:
        return answer(lambda: answers.list_runs(folder, cursor, Budget.of(budget_tokens)))

    @server.tool(
        description=DESCRIPTIONS["diagnose"], annotations=read_only, structured_output=False
    )
    def diagnose(
        run: Annotated[str, Field(description=_RUN)],
        run_id: Annotated[str | None, Field(description=_RUN_ID)] = None,
        budget_tokens: Annotated[int | None, Field(description=_BUDGET)] = None,
    ) -> str:
        return answer(lambda: answers.diagnose(run, run_id, Budget.of(budget_tokens)))

    @server.tool(
        description=DESCRIPTIONS["process"], annotations=read_only, structured_output=False
    )
    def process(
        run: Annotated[str, Field(description=_RUN)],
        rank: Annotated[int, Field(description="The rank (global rank) of the process.")],
        source: Annotated[
            str | None,
            Field(
                description="Only this source (training, rollouter, ...); default: every source with that rank."
            ),
        ] = None,
        records: Annotated[
            int, Field(description="How many of its last records to include (0 to 50).")
        ] = 10,
        run_id: Annotated[str | None, Field(description=_RUN_ID)] = None,
        budget_tokens: Annotated[int | None, Field(description=_BUDGET)] = None,
    ) -> str:
        return answer(
            lambda: answers.process(run, rank, run_id, source, records, Budget.of(budget_tokens))
        )

    @server.tool(description=DESCRIPTIONS["steps"], annotations=read_only, structured_output=False)
    def steps(
        run: Annotated[str, Field(description=_RUN)],
        ranks: Annotated[str | None, Field(description=_RANKS)] = None,
        steps: Annotated[str | None, Field(description=_STEPS)] = None,
        cursor: Annotated[
            str | None, Field(description="next_cursor of the previous answer, for the next page.")
        ] = None,
        run_id: Annotated[str | None, Field(description=_RUN_ID)] = None,
        budget_tokens: Annotated[int | None, Field(description=_BUDGET)] = None,
    ) -> str:
        return answer(
            lambda: answers.steps(run, ranks, steps, run_id, cursor, Budget.of(budget_tokens))
        )

    @server.tool(
        description=DESCRIPTIONS["compare"], annotations=read_only, structured_output=False
    )
    def compare(
        run: Annotated[str, Field(description=_RUN)],
        rank: Annotated[int, Field(description="The rank to compare.")],
        peers: Annotated[
            str | None,
            Field(
                description="The ranks to compare it with, e.g. '0-7'; default: its peers in the straggler rule, else every rank of its source."
            ),
        ] = None,
        run_id: Annotated[str | None, Field(description=_RUN_ID)] = None,
        budget_tokens: Annotated[int | None, Field(description=_BUDGET)] = None,
    ) -> str:
        return answer(lambda: answers.compare(run, rank, peers, run_id, Budget.of(budget_tokens)))

    @server.tool(description=DESCRIPTIONS["sql"], annotations=read_only, structured_output=False)
    def sql(
        run: Annotated[str, Field(description=_RUN)],
        query: Annotated[
            str, Field(description="One SELECT statement over the views named above.")
        ],
        max_rows: Annotated[
            int, Field(description=f"Rows to return at most (1 to {SQL_MAX_ROWS}).")
        ] = SQL_DEFAULT_ROWS,
        run_id: Annotated[str | None, Field(description=_RUN_ID)] = None,
        budget_tokens: Annotated[int | None, Field(description=_BUDGET)] = None,
    ) -> str:
        return answer(lambda: answers.sql(run, query, run_id, max_rows, Budget.of(budget_tokens)))

    @server.tool(
        description=DESCRIPTIONS["live"],
        annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=False, openWorldHint=False),  # type: ignore[call-arg]  # the MCP names (pydantic aliases), as the protocol spells them
        structured_output=False,
    )
    def live(
        run: Annotated[str, Field(description=_RUN)],
        request_black_boxes: Annotated[
            bool,
            Field(
                description="Touch the dump trigger file on a suspected hang, as watch does (default true)."
            ),
        ] = True,
        budget_tokens: Annotated[int | None, Field(description=_BUDGET)] = None,
    ) -> str:
        return answer(lambda: answers.live(run, request_black_boxes, Budget.of(budget_tokens)))

    @server.tool(
        description=DESCRIPTIONS["export"],
        annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, openWorldHint=False),  # type: ignore[call-arg]  # the MCP names (pydantic aliases), as the protocol spells them
        structured_output=False,
    )
    def export(
        run: Annotated[str, Field(description=_RUN)],
        ranks: Annotated[str | None, Field(description=_RANKS)] = None,
        steps: Annotated[str | None, Field(description=_STEPS)] = None,
        native: Annotated[
            bool, Field(description="Perfetto's native protobuf format instead of JSON.")
        ] = False,
        run_id: Annotated[str | None, Field(description=_RUN_ID)] = None,
        budget_tokens: Annotated[int | None, Field(description=_BUDGET)] = None,
    ) -> str:
        return answer(
            lambda: answers.export(run, ranks, steps, run_id, native, Budget.of(budget_tokens))
        )

    @server.resource(
        GUIDE_URI,
        name="guide",
        description="How to use these tools: when to call which, how to read a verdict, what to do next.",
        mime_type="text/markdown",
    )
    def guide() -> str:
        return guide_text()

    @server.resource(
        SCHEMA_URI,
        name="schema",
        description="The record schema: the fields of every JSONL record, the logger's own records, the SQL views.",
        mime_type="application/json",
    )
    def schema() -> str:
        return json_bytes(schema_resource()).decode()

    return server


def serve(folders: list[str], *, cache: bool = True) -> None:
    """Serve `folders` over stdio until the client closes the pipe."""
    build_server(folders, cache=cache).run("stdio")


def serve_http(
    folders: list[str],
    host: str,
    port: int,
    token: str,
    *,
    cache: bool = True,
    announce: Callable[[str], None] = print,
) -> None:
    """Serve `folders` over streamable HTTP on `host`:`port` (loopback: the caller checks) until
    interrupted; every request must carry `token`.

    The socket is bound here, so that port 0 gets a free port; `announce` is
    told the endpoint's URL once it accepts connections.
    """
    import uvicorn  # the SDK's own dependency

    app = _bearer_only(build_server(folders, cache=cache).streamable_http_app(host=host), token)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    announce(f"http://{shown}:{sock.getsockname()[1]}/mcp")
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


def _bearer_only(app: Callable[..., Awaitable[None]], token: str) -> Callable[..., Awaitable[None]]:
    """`app`, answering 401 to any HTTP request without ``Authorization: Bearer <token>`` (compared
    in constant time)."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = next(
                (value for name, value in scope.get("headers") or [] if name == b"authorization"),
                b"",
            )
            if not hmac.compare_digest(given, expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"text/plain; charset=utf-8"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"otel-titan mcp: this server needs its bearer token (Authorization: Bearer TOKEN)\n",
                    }
                )
                return
        await app(scope, receive, send)

    return guarded
