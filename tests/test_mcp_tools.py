"""Tools served by a real MCP server are recorded like the agent's own, with the server they came from.

The server is ``examples/mcp_notes_server.py`` (FastMCP, the ``mcp`` SDK),
started the way users start one: as a stdio subprocess by the framework's
MCP client, or over streamable HTTP on loopback (a subprocess of the test).
Each agent is built as its framework's docs build one, beside one local tool
(``double``), and driven by the scripted policy inside a rollout through
``collect_rollouts``. The script: ``lookup("A1")`` (the server answers
``42``), ``double(21)`` (local), ``lookup("Z9")`` (the tool raises: the server
answers ``isError``), ``fail("no")`` (the tool returns ``isError`` itself),
then an answer. Every call must be recorded with its arguments, the text the
model read, ``error`` for both failures, and ``source``: ``mcp:<server>`` for
the server's tools, None for the local one.

Strands names the server by the name it declares (``notes``); LangChain by
its key in ``MultiServerMCPClient`` (``kb``); the OpenAI Agents SDK by the
server's ``name`` (``kb-sdk``). Where mtrl cannot record (an Agent built
before its rollout, a run without ``MtrlRunHooks``) the rollout is flagged
``tool_calls_unrecorded``; where it cannot name the server, a warning names
the fix and the calls are recorded ``source="mcp"``.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import httpx
import pytest

from mtrl_adapters import rollout, update_reward
from mtrl_runtime import MtrlConfig, ScriptedEngine, Task
from mtrl_runtime.engines import ScriptedReply
from mtrl_runtime.rollouts import collect_rollouts
from mtrl_runtime.testing import tiny_tokenizer

pytest.importorskip("mcp")
from mcp import StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "examples" / "mcp_notes_server.py"
TASK = Task(id="t1", prompt="What is stored under A1, doubled?")
SCRIPT = [
    ScriptedReply.tool_call("lookup", {"key": "A1"}),
    ScriptedReply.tool_call("double", {"x": 21}),
    ScriptedReply.tool_call("lookup", {"key": "Z9"}),
    ScriptedReply.tool_call("fail", {"reason": "no"}),
    "A1 holds 42.",
]


def expected(server: str) -> list[tuple]:
    """(name, arguments, result, status, error, source) of the script's four calls, served by ``server``."""
    missing = "Error executing tool lookup: 'Z9'"
    return [
        ("lookup", {"key": "A1"}, "42", "success", None, f"mcp:{server}"),
        ("double", {"x": 21}, "42", "success", None, None),
        ("lookup", {"key": "Z9"}, missing, "error", missing, f"mcp:{server}"),
        ("fail", {"reason": "no"}, "refused: no", "error", "refused: no", f"mcp:{server}"),
    ]


@pytest.fixture(scope="module")
def http_url():
    """The notes server over streamable HTTP on loopback; its URL once it accepts connections."""
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), (line, proc.poll())
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def collect(tmp_path: Path, run, script=SCRIPT):
    engine = ScriptedEngine(tiny_tokenizer(), list(script))
    config = MtrlConfig.coerce({"core": {"run_dir": str(tmp_path / "run"), "group_size": 1}})
    [record] = asyncio.run(collect_rollouts(config, run, [TASK], engine=engine)).rollouts
    return record


def check(record, server: str) -> None:
    """Every call recorded as ``expected``; each result is the text the model read for that call."""
    assert record.status.value == "completed", record.error
    got = [(c.name, c.arguments, c.result, c.status, c.error, c.source) for c in record.tool_calls]
    assert got == expected(server), got
    read = {m["tool_call_id"]: m["content"] for m in record.turns[-1].messages if m["role"] == "tool"}
    assert {c.call_id: c.result for c in record.tool_calls} == read
    assert [c.turn_index for c in record.tool_calls] == [0, 1, 2, 3]
    assert all(c.latency_s > 0 for c in record.tool_calls)
    assert "tool_calls_unrecorded" not in record.metrics, record.metrics


# ---- Strands: MCPClient ------------------------------------------------------------------------------------


def _strands():
    pytest.importorskip("strands")
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel
    from strands.tools.mcp import MCPClient

    @tool
    def double(x: int) -> int:
        """Double a number."""
        return 2 * x

    model = OpenAIModel(client_args={"api_key": "sk-user-real-key", "max_retries": 0}, model_id="gpt-4o-mini")
    return Agent, MCPClient, double, model


STRANDS_TRANSPORTS = {
    "stdio": lambda url: stdio_client(StdioServerParameters(command=sys.executable, args=[str(SERVER)])),
    "streamable-http": lambda url: streamablehttp_client(url),
}


@pytest.mark.parametrize("transport", list(STRANDS_TRANSPORTS))
def test_strands_mcp_client_tools_are_recorded_with_the_server_name(transport, http_url, tmp_path):
    """Strands' docs: ``with MCPClient(lambda: stdio_client(...)) as client: Agent(tools=client.list_tools_sync())``."""
    Agent, MCPClient, double, model = _strands()
    notes = MCPClient(lambda: STRANDS_TRANSPORTS[transport](http_url))

    @rollout
    def run(task):
        with notes:
            agent = Agent(model=model, tools=[*notes.list_tools_sync(), double], callback_handler=None)
            update_reward(1.0 if "42" in str(agent(task.prompt)) else 0.0)

    record = collect(tmp_path, run)
    check(record, "notes")  # the name the server declares: FastMCP("notes")
    assert record.reward == 1.0


def test_strands_agent_given_the_client_itself_is_recorded(tmp_path):
    """Strands' managed form, ``Agent(tools=[client])``: the Agent starts the client (and stops it on cleanup)."""
    Agent, MCPClient, double, model = _strands()

    @rollout
    def run(task):
        notes = MCPClient(lambda: stdio_client(StdioServerParameters(command=sys.executable, args=[str(SERVER)])))
        agent = Agent(model=model, tools=[notes, double], callback_handler=None)
        try:
            agent(task.prompt)
        finally:
            agent.cleanup()
        update_reward(1.0)

    check(collect(tmp_path, run), "notes")


def test_strands_agent_built_before_the_rollout_is_flagged_and_an_unseen_handshake_warns(tmp_path, caplog):
    """An Agent (and its MCP client) made before any rollout opened: no hooks, so no call is recorded; the
    rollout says so (``tool_calls_unrecorded``) and the coordinator logs the fix. Attached by hand
    (``attach``), the calls are recorded, with ``source="mcp"`` and a warning: the client's handshake
    happened before mtrl could see it, so the server's name is unknown."""
    from mtrl_adapters.mcp import uninstall_mcp
    from mtrl_adapters.strands import attach
    from mcp.client.session import ClientSession

    Agent, MCPClient, double, model = _strands()
    uninstall_mcp(ClientSession)  # as in a fresh process: no rollout has opened yet
    notes = MCPClient(lambda: stdio_client(StdioServerParameters(command=sys.executable, args=[str(SERVER)])))
    with notes:
        early = Agent(model=model, tools=[*notes.list_tools_sync(), double], callback_handler=None)

        @rollout
        def run(task):
            early(task.prompt)
            update_reward(0.0)

        with caplog.at_level(logging.WARNING):
            record = collect(tmp_path / "a", run)
        assert record.tool_calls == () and record.metrics["tool_calls_unrecorded"] == 4.0, record.metrics
        assert "4 tool call(s) unrecorded" in caplog.text and "agent_factory" in caplog.text, caplog.text

        attach(early)
        early.messages.clear()
        with pytest.warns(RuntimeWarning, match="Strands MCPClient: .* recorded with source 'mcp'; start the client"):
            record = collect(tmp_path / "b", run)
    got = [(c.name, c.status, c.source) for c in record.tool_calls]
    assert got == [("lookup", "success", "mcp"), ("double", "success", None), ("lookup", "error", "mcp"),
                   ("fail", "error", "mcp")], got


# ---- LangChain / LangGraph: langchain-mcp-adapters ---------------------------------------------------------


def _langchain():
    pytest.importorskip("langchain_mcp_adapters")
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def double(x: int) -> int:
        """Double a number."""
        return 2 * x

    def graph(tools):
        # its own HTTP client: langchain-openai shares one by default, whose pooled connections belong to the
        # event loop that opened them, and each test here runs its rollouts in a loop of its own
        llm = ChatOpenAI(model="gpt-4o-mini", api_key="sk-user-real-key", max_retries=0,
                         http_async_client=httpx.AsyncClient())
        return create_agent(llm, [*tools, double])

    return graph


LANGCHAIN_CONNECTIONS = {
    "stdio": lambda url: {"transport": "stdio", "command": sys.executable, "args": [str(SERVER)]},
    "streamable-http": lambda url: {"transport": "streamable_http", "url": url},
}


@pytest.mark.parametrize("transport", list(LANGCHAIN_CONNECTIONS))
def test_langchain_multi_server_client_tools_are_recorded_with_the_server_key(transport, http_url, tmp_path):
    """The adapters' README: ``MultiServerMCPClient({...}).get_tools()`` into ``create_agent``. The tools are
    loaded once, before any rollout (each call opens its own session, as the adapters do)."""
    from langchain_mcp_adapters.client import MultiServerMCPClient

    graph = _langchain()
    client = MultiServerMCPClient({"kb": LANGCHAIN_CONNECTIONS[transport](http_url)})
    agent = graph(asyncio.run(client.get_tools()))

    @rollout
    async def run(task):
        state = await agent.ainvoke({"messages": [("user", task.prompt)]})
        update_reward(1.0 if "42" in state["messages"][-1].content else 0.0)

    record = collect(tmp_path, run)
    check(record, "kb")
    assert record.reward == 1.0


def test_langchain_tools_from_one_session_and_an_unnamed_server(tmp_path):
    """``load_mcp_tools(session, server_name=...)`` over one session per rollout names the server; without
    ``server_name`` the adapters know none: recorded ``source="mcp"``, and a warning names the fix."""
    from langchain_mcp_adapters.tools import load_mcp_tools
    from mcp import ClientSession

    graph = _langchain()

    def run_with(**names):
        @rollout
        async def run(task):
            params = StdioServerParameters(command=sys.executable, args=[str(SERVER)])
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                agent = graph(await load_mcp_tools(session, **names))
                await agent.ainvoke({"messages": [("user", task.prompt)]})
            update_reward(0.0)

        return run

    check(collect(tmp_path / "named", run_with(server_name="notes-kb")), "notes-kb")
    with pytest.warns(RuntimeWarning, match="langchain-mcp-adapters: .* load_mcp_tools\\(session, server_name=...\\)"):
        record = collect(tmp_path / "unnamed", run_with())
    assert [c.source for c in record.tool_calls] == ["mcp", None, "mcp", "mcp"]


# ---- OpenAI Agents SDK: agents.mcp -------------------------------------------------------------------------


def _agents_sdk(monkeypatch):
    pytest.importorskip("agents")
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.mcp import MCPServerStdio, MCPServerStreamableHttp

    monkeypatch.setenv("OPENAI_API_KEY", "sk-user-real-key")

    @function_tool
    def double(x: int) -> int:
        """Double a number."""
        return 2 * x

    servers = {
        "stdio": lambda url: MCPServerStdio(name="kb-sdk", params={"command": sys.executable, "args": [str(SERVER)]}),
        "streamable-http": lambda url: MCPServerStreamableHttp(name="kb-sdk", params={"url": url}),
    }
    return Agent, RunConfig, Runner, double, servers


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
def test_openai_agents_mcp_server_tools_are_recorded_with_the_server_name(transport, http_url, tmp_path,
                                                                         monkeypatch):
    """The SDK's docs: ``async with MCPServerStdio(...) as server: Agent(mcp_servers=[server])``, run with
    ``hooks=MtrlRunHooks()``. The SDK turns an MCP error result into text for the model and gives hooks no
    error flag: mtrl reads it where the SDK calls the server, so both failures are recorded ``error``."""
    from mtrl_adapters.openai_agents import MtrlRunHooks

    Agent, RunConfig, Runner, double, servers = _agents_sdk(monkeypatch)

    @rollout
    async def run(task):
        async with servers[transport](http_url) as server:
            agent = Agent(name="notes", instructions="Use the tools.", mcp_servers=[server], tools=[double])
            result = await Runner.run(agent, task.prompt, hooks=MtrlRunHooks(),
                                      run_config=RunConfig(tracing_disabled=True))
        update_reward(1.0 if "42" in result.final_output else 0.0)

    record = collect(tmp_path, run)
    assert record.status.value == "completed", record.error
    got = [(c.name, c.arguments, str(c.result), c.status, c.error, c.source) for c in record.tool_calls]
    assert got == expected("kb-sdk"), got  # double's result is the int 42, read as "42"
    read = {m["tool_call_id"]: m["content"] for m in record.turns[-1].messages if m["role"] == "tool"}
    assert {c.call_id: str(c.result) for c in record.tool_calls} == read
    assert record.reward == 1.0 and "tool_calls_unrecorded" not in record.metrics


def test_openai_agents_mcp_run_without_hooks_is_flagged(tmp_path, monkeypatch):
    """Without ``hooks=MtrlRunHooks()`` the SDK reports its tool calls to nobody: the rollout is flagged."""
    Agent, RunConfig, Runner, double, servers = _agents_sdk(monkeypatch)

    @rollout
    async def run(task):
        async with servers["stdio"](None) as server:
            agent = Agent(name="notes", instructions="Use the tools.", mcp_servers=[server], tools=[double])
            await Runner.run(agent, task.prompt, run_config=RunConfig(tracing_disabled=True))
        update_reward(0.0)

    record = collect(tmp_path, run)
    assert record.tool_calls == () and record.metrics["tool_calls_unrecorded"] == 4.0, record.metrics


def test_outside_a_rollout_nothing_is_noted_and_nothing_warns():
    """The MCP wrappers do nothing outside a rollout: a session initializes and calls as the SDK does."""
    from mcp import ClientSession

    from mtrl_adapters import instrument

    async def main():
        params = StdioServerParameters(command=sys.executable, args=[str(SERVER)])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return session, await session.call_tool("lookup", {"key": "A1"})

    instrument()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session, result = asyncio.run(main())
    assert result.content[0].text == "42" and not result.isError
    from mtrl_adapters.mcp import declared_server_name

    assert declared_server_name(session) == "notes"  # noted for a later rollout's records; nothing else changed


def test_an_own_tool_loop_records_the_server_with_record_tool_call(tmp_path):
    """An agent that calls the MCP server itself (``ClientSession.call_tool``) reports each call with
    ``record_tool_call(..., source="mcp:<server>")``; an empty source is refused, naming the field."""
    from mcp import ClientSession

    from mtrl_adapters import record_tool_call

    @rollout
    async def run(task):
        params = StdioServerParameters(command=sys.executable, args=[str(SERVER)])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("lookup", {"key": "A1"})
        text = result.content[0].text
        record_tool_call("lookup", {"key": "A1"}, result=text, source="mcp:notes")
        with pytest.raises(ValueError, match="source"):
            record_tool_call("lookup", {"key": "A1"}, result=text, source="")
        update_reward(1.0 if text == "42" else 0.0)

    record = collect(tmp_path, run, script=["done"])
    assert [(c.name, c.result, c.source) for c in record.tool_calls] == [("lookup", "42", "mcp:notes")]
    assert record.reward == 1.0
