"""The environment toolkit: replayed tools, sandboxes, per-rollout SQLite, safe_eval and the checks."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import warnings

import pytest

from mtrl_runtime.envs import (
    ReplayTool,
    Sandbox,
    SandboxError,
    SandboxPool,
    SandboxTeardownError,
    SqliteEnv,
    check_determinism,
    check_determinism_async,
    check_isolation,
    describe_tools,
    result_sets_equal,
    safe_eval,
)

AIRCRAFT_CSV = "aircraft_id,model,seats\nA320-1,Airbus A320,180\nB737-2,Boeing 737,160\n42,Cessna 172,4\n"


@pytest.fixture
def aircraft(tmp_path):
    path = tmp_path / "aircraft.csv"
    path.write_text(AIRCRAFT_CSV)
    return ReplayTool.from_csv(path, "get_aircraft", key_fields=["aircraft_id"], description="Aircraft by id.")


# -- ReplayTool ---------------------------------------------------------------------------------


def test_replay_returns_the_row_and_normalizes_arguments(aircraft):
    row = {"aircraft_id": "A320-1", "model": "Airbus A320", "seats": "180"}
    assert aircraft(aircraft_id="A320-1") == row
    assert aircraft(aircraft_id="  a320-1 ") == row  # whitespace and case
    assert aircraft(aircraft_id=42)["model"] == "Cessna 172"  # an int argument matches the CSV text "42"
    assert aircraft(aircraft_id=42.0)["model"] == "Cessna 172"
    assert aircraft(aircraft_id=" 42 ")["model"] == "Cessna 172"


def test_replay_unknown_key_is_an_error_result_not_an_exception(aircraft):
    assert aircraft(aircraft_id="X9") == {"error": "no record for aircraft_id='X9'"}
    assert aircraft(aircraft_id="042") == {"error": "no record for aircraft_id='042'"}  # an id, not the number 42
    assert aircraft() == {"error": "missing argument 'aircraft_id' for get_aircraft"}
    assert aircraft(aircraft_id="  ")["error"].startswith("missing argument")
    bad = aircraft(aircraft_id="A320-1", seat=3)
    assert bad["error"] == "unknown argument 'seat' for get_aircraft; expected aircraft_id"


def test_replay_is_deterministic_and_does_not_share_its_rows(aircraft):
    first = aircraft(aircraft_id="B737-2")
    first["seats"] = "0"  # a caller mutating its result must not change the fixture
    fn = aircraft.as_function()
    assert fn(aircraft_id="B737-2") == fn(aircraft_id="B737-2") == json.dumps(
        {"aircraft_id": "B737-2", "model": "Boeing 737", "seats": "160"}, sort_keys=True
    )


def test_replay_many_rows_per_key_and_duplicate_key_errors(tmp_path):
    rows = [
        {"origin": "SEA", "dest": "SFO", "flight": 1},
        {"origin": "SEA", "dest": "SFO", "flight": 2},
        {"origin": "SEA", "dest": "LAX", "flight": 3},
    ]
    flights = ReplayTool.from_rows("find_flights", rows, ["origin", "dest"], many=True)
    assert flights(origin="sea", dest="SFO") == {"results": [rows[0], rows[1]]}
    assert flights(origin="SEA", dest="JFK") == {"error": "no record for origin='SEA', dest='JFK'"}
    with pytest.raises(ValueError, match="share the key"):
        ReplayTool.from_rows("find_flights", rows, ["origin", "dest"])
    with pytest.raises(ValueError, match="no key field 'dest'"):
        ReplayTool.from_rows("t", [{"origin": "SEA"}], ["dest"])


def test_replay_from_json_and_jsonl_with_a_typed_schema(tmp_path):
    rows = [{"user_id": 7, "name": "Ada"}, {"user_id": 8, "name": "Lin"}]
    (tmp_path / "users.json").write_text(json.dumps(rows))
    (tmp_path / "users.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for name in ("users.json", "users.jsonl"):
        tool = ReplayTool.from_json(tmp_path / name, "get_user", ["user_id"], field_descriptions={"user_id": "the user"})
        assert tool(user_id="8") == rows[1]
        assert tool.parameters == {
            "type": "object",
            "properties": {"user_id": {"type": "integer", "description": "the user"}},
            "required": ["user_id"],
            "additionalProperties": False,
        }
    (tmp_path / "bad.json").write_text('{"user_id": 7}')
    with pytest.raises(ValueError, match="bad.json: expected a list of JSON objects"):
        ReplayTool.from_json(tmp_path / "bad.json", "get_user", ["user_id"])


def test_replay_function_form_wraps_as_a_strands_and_a_langchain_tool(aircraft):
    fn = aircraft.as_function()
    assert fn.__name__ == "get_aircraft"
    assert str(inspect.signature(fn)) == "(*, aircraft_id: str) -> str"
    strands = pytest.importorskip("strands")
    spec = strands.tool(fn).tool_spec
    assert spec["name"] == "get_aircraft"
    assert spec["inputSchema"]["json"]["required"] == ["aircraft_id"]
    lc_tools = pytest.importorskip("langchain_core.tools")
    lc = lc_tools.StructuredTool.from_function(fn)
    assert json.loads(lc.invoke({"aircraft_id": "b737-2"}))["seats"] == "160"


async def test_replay_is_deterministic_across_8_concurrent_rollouts(aircraft):
    async def rollout(i: int) -> list[str]:
        ids = ["A320-1", "X9", "42", "B737-2"]
        out = []
        for aid in ids[i % 2:]:
            out.append(await asyncio.to_thread(aircraft.as_function(), aircraft_id=aid))
            await asyncio.sleep(0)
        return out

    results = await asyncio.gather(*(rollout(i) for i in range(8)))
    assert all(r == results[0] for r in results[0::2]) and all(r == results[1] for r in results[1::2])
    assert json.loads(results[1][0]) == {"error": "no record for aircraft_id='X9'"}


# -- Sandbox ------------------------------------------------------------------------------------


class Resource:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def close(self) -> None:
        self.log.append(self.name)


def test_sandbox_tears_down_once_newest_first_and_removes_its_folder():
    log: list[str] = []
    with Sandbox("r1") as sb:
        folder = sb.workdir
        (folder / "notes.txt").write_text("x")
        sb.register(Resource("db", log))
        sb.register("vm-7", cleanup=lambda r: log.append(f"stop {r}"))
        sb.state["files"] = 1
    assert log == ["stop vm-7", "db"]
    assert not folder.exists()
    assert sb.teardowns == 1 and sb.end_reason == "completed"
    sb.close()
    sb.close("again")
    assert sb.teardowns == 1 and log == ["stop vm-7", "db"] and sb.end_reason == "completed"
    with pytest.raises(SandboxError, match="torn down"):
        sb.register(Resource("late", log))
    with pytest.raises(SandboxError, match="torn down"):
        _ = sb.workdir


def test_sandbox_torn_down_when_the_agent_crashes():
    log: list[str] = []
    with pytest.raises(RuntimeError, match="agent blew up"):
        with Sandbox("r-crash") as sb:
            folder = sb.workdir
            sb.register(Resource("browser", log))
            raise RuntimeError("agent blew up")
    assert log == ["browser"] and not folder.exists()
    assert sb.teardowns == 1
    assert sb.end_reason == "crash: RuntimeError: agent blew up"


def test_sandbox_terminal_action_and_max_turns_reasons():
    log: list[str] = []
    with Sandbox("r-term") as sb:
        sb.register(Resource("cart", log))
        sb.close("terminal: submit_order")  # the terminal tool ends the episode itself
        assert log == ["cart"] and sb.closed
    assert sb.teardowns == 1 and sb.end_reason == "terminal: submit_order"
    with Sandbox("r-turns") as sb2:
        sb2.end("max_turns")  # the agent loop ran out of turns
    assert sb2.end_reason == "max_turns" and sb2.teardowns == 1


def test_a_failing_cleanup_does_not_stop_the_others():
    log: list[str] = []

    def boom(_):
        raise OSError("disk gone")

    with pytest.raises(SandboxTeardownError, match="disk gone"):
        with Sandbox("r-fail") as sb:
            sb.register(Resource("first", log))
            sb.register("bad", cleanup=boom)
            sb.register(Resource("last", log))
    assert log == ["last", "first"] and sb.teardowns == 1
    # After a crash the agent's exception is what propagates; the cleanup error stays recorded.
    with pytest.raises(KeyError):
        with Sandbox("r-fail2") as sb2:
            sb2.register("bad", cleanup=boom)
            raise KeyError("agent")
    assert sb2.teardown_errors == ["str: OSError: disk gone"]


async def test_async_sandbox_awaits_async_cleanups_and_survives_a_crash():
    log: list[str] = []

    async def stop(resource):
        await asyncio.sleep(0)
        log.append(f"stopped {resource}")

    with pytest.raises(ValueError):
        async with Sandbox("r-async") as sb:
            sb.register("container", cleanup=stop)
            await asyncio.sleep(0)
            raise ValueError("crash mid-turn")
    assert log == ["stopped container"] and sb.teardowns == 1


def test_sync_close_refuses_an_async_cleanup_without_leaking_a_coroutine():
    async def stop(resource):
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine was never awaited" would fail the test
        sb = Sandbox("r-mixed").open()
        sb.register("container", cleanup=stop)
        sb.close()
    assert sb.teardown_errors == ["str: async cleanup needs 'async with' or aclose()"]


async def test_sandbox_pool_isolates_8_concurrent_rollouts_and_tears_all_down():
    pool = SandboxPool(setup=lambda sb: sb.state.setdefault("created", []))

    async def rollout(i: int) -> dict:
        rid = f"rollout-{i}"
        async with pool.asession(rid) as sb:
            sb.state["created"].append(f"file-{i}")
            (sb.workdir / f"file-{i}.txt").write_text(str(i))
            await asyncio.sleep(0.01 * (i % 3))  # interleave the rollouts
            assert pool.get(rid) is sb
            if i == 3:
                raise RuntimeError("rollout 3 crashed")
            return {"state": list(sb.state["created"]), "files": sorted(p.name for p in sb.workdir.iterdir())}

    results = await asyncio.gather(*(rollout(i) for i in range(8)), return_exceptions=True)
    for i, result in enumerate(results):
        if i == 3:
            assert isinstance(result, RuntimeError)
        else:
            assert result == {"state": [f"file-{i}"], "files": [f"file-{i}.txt"]}
    assert pool.opened == 8 and pool.teardowns == 8 and pool.active == []
    with pytest.raises(SandboxError, match="no live sandbox for rollout 'rollout-0'"):
        pool.get("rollout-0")


async def test_sandbox_pool_rejects_a_second_live_sandbox_and_tears_down_on_cancel():
    pool = SandboxPool()
    started = asyncio.Event()

    async def slow():
        async with pool.asession("r") as sb:
            started.set()
            await asyncio.sleep(30)
        return sb

    task = asyncio.create_task(slow())
    await started.wait()
    with pytest.raises(SandboxError, match="already has a live sandbox"):
        pool.open("r")
    sb = pool.get("r")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sb.end_reason == "cancelled" and pool.teardowns == 1 and pool.active == []


# -- SqliteEnv ----------------------------------------------------------------------------------

SCHEMA = """
CREATE TABLE flights (id INTEGER PRIMARY KEY, origin TEXT, dest TEXT, price REAL);
CREATE TABLE notes (rollout TEXT, body TEXT);
"""
SEED = {
    "flights": [
        {"id": 1, "origin": "SEA", "dest": "SFO", "price": 120.5},
        {"id": 2, "origin": "SEA", "dest": "LAX", "price": 99.0},
        {"id": 3, "origin": "SFO", "dest": "JFK", "price": 310.25},
    ]
}


@pytest.fixture
def sql_env():
    env = SqliteEnv(SCHEMA, SEED, row_limit=2, timeout_s=0.2)
    yield env
    env.close()


def test_sqlite_query_returns_limited_rows(sql_env):
    with sql_env.open() as db:
        result = db.query("SELECT id, dest FROM flights ORDER BY id")
        assert result == {"columns": ["id", "dest"], "rows": [[1, "SFO"], [2, "LAX"]], "row_count": 2, "truncated": True}
        assert db.query("SELECT count(*) AS n FROM flights")["rows"] == [[3]]
        assert db.fetch_all("SELECT id FROM flights ORDER BY id") == [(1,), (2,), (3,)]  # no row limit


@pytest.mark.parametrize("sql", [
    "INSERT INTO notes VALUES ('x', 'y')",
    "UPDATE flights SET price = 0",
    "DELETE FROM flights",
    "DROP TABLE flights",
    "PRAGMA table_info(flights)",
    "ATTACH DATABASE 'other.db' AS other",
    "CREATE TABLE t (a)",
])
def test_sqlite_query_tool_is_read_only(sql_env, sql):
    with sql_env.open() as db:
        assert db.query(sql) == {"error": "only read-only queries (SELECT / WITH) are allowed"}
        assert db.fetch_all("SELECT count(*) FROM flights") == [(3,)]


def test_sqlite_read_only_holds_for_a_statement_the_environment_already_ran(sql_env):
    with sql_env.open() as db:
        insert = "INSERT INTO notes VALUES ('env', 'setup')"
        assert db.execute(insert) == 1  # the environment's own write, cached as a prepared statement
        assert db.query(insert)["error"].startswith("only read-only")
        assert db.fetch_all("SELECT count(*) FROM notes") == [(1,)]


def test_sqlite_query_errors_and_timeout_are_results(sql_env):
    with sql_env.open() as db:
        assert db.query("SELECT * FROM nope") == {"error": "query failed: no such table: nope"}
        assert db.query("SELECT 1; SELECT 2")["error"].startswith("query failed")
        assert db.query("") == {"error": "sql must be a non-empty SQL string"}
        start = time.monotonic()
        endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
        assert db.query(endless) == {"error": "query timed out after 0.2s"}
        assert time.monotonic() - start < 2.0
        assert db.query("SELECT 1 AS one")["rows"] == [[1]]  # the handler is gone after the timeout


def test_sqlite_query_tool_spec_and_call(sql_env):
    with sql_env.open() as db:
        tool = db.query_tool()
        assert describe_tools([tool]) == [{
            "name": "query_database",
            "description": "Run one read-only SQL query (SQLite dialect) and get its rows (at most 2).",
            "parameters": tool.parameters,
        }]
        assert json.loads(tool.as_function()(sql="SELECT dest FROM flights WHERE id = 3"))["rows"] == [["JFK"]]
        assert tool(sql="SELECT 1", limit=5)["error"].startswith("unknown argument 'limit'")


def test_sqlite_env_reports_bad_schema_and_seed_rows():
    with pytest.raises(ValueError, match="schema or seed rows failed"):
        SqliteEnv("CREATE TABLE t (")
    with pytest.raises(ValueError, match=r"seed_rows\['t'\]\[1\]: expected the columns \['a'\]"):
        SqliteEnv("CREATE TABLE t (a, b)", {"t": [{"a": 1}, {"b": 2}]})
    with pytest.raises(ValueError, match=r"seed_rows\['t'\]\[1\]"):
        SqliteEnv("CREATE TABLE t (a, b)", {"t": [{"a": 1, "b": 2}, (3, 4)]})
    positional = SqliteEnv("CREATE TABLE t (a, b)", {"t": [(1, 2), (3, 4)]})
    with positional.open() as db:
        assert db.fetch_all("SELECT a + b FROM t ORDER BY a") == [(3,), (7,)]
    positional.close()


async def test_sqlite_databases_are_isolated_across_8_concurrent_rollouts(sql_env):
    async def rollout(i: int) -> list:
        with sql_env.open() as db:
            db.execute("INSERT INTO notes VALUES (?, ?)", (f"r{i}", "booked"))
            db.execute("DELETE FROM flights WHERE id = ?", (1 + i % 3,))
            await asyncio.sleep(0.005 * (i % 4))
            return db.fetch_all("SELECT rollout FROM notes") + db.fetch_all("SELECT count(*) FROM flights")

    results = await asyncio.gather(*(rollout(i) for i in range(8)))
    assert results == [[(f"r{i}",), (2,)] for i in range(8)]
    with sql_env.open() as fresh:  # the template is untouched
        assert fresh.fetch_all("SELECT count(*) FROM notes UNION ALL SELECT count(*) FROM flights") == [(0,), (3,)]


def test_result_sets_equal():
    assert result_sets_equal([(1, "a"), (2, "b")], [[2, "b"], [1, "a"]])
    assert not result_sets_equal([(1, "a"), (2, "b")], [(2, "b"), (1, "a")], ordered=True)
    assert not result_sets_equal([(1,), (1,), (2,)], [(1,), (2,), (2,)])  # duplicates count
    assert result_sets_equal([(0.1 + 0.2,)], [(0.3,)]) and result_sets_equal([(3,)], [(3.0,)])
    assert not result_sets_equal([(0.3,)], [(0.31,)])
    assert result_sets_equal({"columns": ["n"], "rows": [[3]]}, [(3,)])  # a query result vs gold rows
    assert not result_sets_equal({"error": "boom"}, {"error": "boom"})
    assert result_sets_equal([], [])


# -- safe_eval ----------------------------------------------------------------------------------


@pytest.mark.parametrize("expr, value", [
    ("2 * (3 + 4) ** 2", 98),
    ("7 // 2", 3),
    ("-7 % 3", 2),
    ("2 ** -1", 0.5),
    ("+3 - -2", 5),
    ("sqrt(16) + abs(-2)", 6.0),
    ("max(1, 2, 3) * min(4, 5)", 12),
    ("round(pi, 2)", 3.14),
    ("1_000 / 8", 125.0),
    ("2 ** 100", 1267650600228229401496703205376),
])
def test_safe_eval_values(expr, value):
    assert safe_eval(expr) == value


@pytest.mark.parametrize("expr, message", [
    ("(1).real", "unsupported expression Attribute"),
    ("__import__('os').system('true')", "unsupported expression Attribute"),
    ("__import__('os')", "unsupported function '__import__'"),
    ("eval('1+1')", "unsupported function 'eval'"),
    ("open('/etc/passwd')", "unsupported function 'open'"),
    ("round(2.5, ndigits=1)", "keyword arguments"),
    ("x + 1", "unknown name 'x'"),
    ("'a' * 3", "unsupported constant 'a'"),
    ("True + 1", "unsupported constant True"),
    ("[1, 2][0]", "unsupported expression Subscript"),
    ("(lambda: 1)()", "unsupported expression Lambda"),
    ("2 ^ 3", "unsupported expression BitXor"),
    ("1 < 2", "unsupported expression Compare"),
    ("9 ** 9 ** 9", "exponent 387420489 exceeds 1000"),
    ("10 ** 10 ** 10", "exponent 10000000000 exceeds 1000"),
    ("(10 ** 300) ** 20", "power too large"),
    ("2 ** 4096", "exponent 4096 exceeds 1000"),
    ("10.0 ** 999", "result too large"),
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("(-8) ** (1 / 3)", "complex result"),
    ("sqrt(-1)", "math domain error"),
    ("1 +", "not an arithmetic expression"),
    ("1" + " + 1" * 1000, "the limit is 2000"),
    ("(" * 300 + "1" + ")" * 300, "nested"),
])
def test_safe_eval_rejects(expr, message):
    start = time.monotonic()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("*", r"\*")):
        safe_eval(expr)
    assert time.monotonic() - start < 0.5  # refused before any huge computation


def test_safe_eval_bounds_big_integer_products():
    big = "*".join(["(2 ** 1000)"] * 5)  # 5001 bits: over MAX_INT_BITS
    with pytest.raises(ValueError, match="too large"):
        safe_eval(big)
    assert safe_eval("*".join(["(2 ** 1000)"] * 4)) == 2 ** 4000


# -- checks -------------------------------------------------------------------------------------


def scripted_episode(lookup, ids: list[str], call_id_seed: list[int]) -> list[dict]:
    """A fixed policy acting on an environment: ask, call the tool per id, answer with what it read."""
    messages = [{"role": "user", "content": "How many seats?"}]
    for aid in ids:
        call_id_seed[0] += 1
        call = {"id": f"call_{call_id_seed[0]}", "type": "function",
                "function": {"name": "get_aircraft", "arguments": json.dumps({"aircraft_id": aid})}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": lookup(aircraft_id=aid)})
    messages.append({"role": "assistant", "content": "done"})
    return messages


def test_check_determinism_passes_a_replayed_environment(aircraft):
    counter = [0]  # call ids differ between runs; they are ignored by default
    report = check_determinism(lambda: scripted_episode(aircraft.as_function(), ["A320-1", "X9"], counter))
    assert report.same, str(report)
    assert str(report) == "deterministic: both runs produced the same 6 messages"


def test_check_determinism_names_the_message_and_field_that_differ(aircraft):
    stock = {"seats": 3}

    def leaky_lookup(aircraft_id):  # state leaks across episodes: each call books a seat
        stock["seats"] -= 1
        return json.dumps({"aircraft_id": aircraft_id, "seats_left": stock["seats"]})

    counter = [0]
    report = check_determinism(lambda: scripted_episode(leaky_lookup, ["A320-1"], counter))
    assert not report.same
    diff = report.first_difference
    assert (diff.index, diff.field) == (2, "content")
    assert "message 2 content" in str(report)


def test_check_determinism_compares_tool_arguments_as_json_and_reports_length():
    a = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1, "y": 2}'}}]}]
    b = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"y":2,"x":1}'}}]}]
    runs = iter([a, b])
    assert check_determinism(lambda: next(runs)).same
    runs = iter([a, a + [{"role": "assistant", "content": "extra"}]])
    report = check_determinism(lambda: next(runs))
    assert (report.length_first, report.length_second) == (1, 2)
    assert report.first_difference.index == 1 and report.first_difference.field == "(message)"


async def test_check_determinism_async_and_a_clear_error_for_async_in_sync():
    async def episode():
        await asyncio.sleep(0)
        return [{"role": "user", "content": "hi"}]

    assert (await check_determinism_async(episode)).same
    with pytest.raises(TypeError, match="use check_determinism_async"):
        check_determinism(episode)


async def test_check_isolation_passes_per_rollout_databases(sql_env):
    async def run(marker: str):
        with sql_env.open() as db:
            db.execute("INSERT INTO notes VALUES (?, 'x')", (marker,))
            await asyncio.sleep(0.01)
            return db.fetch_all("SELECT rollout FROM notes")

    report = await check_isolation(run, runs=8)
    assert report.isolated, str(report)
    assert len(report.markers) == 8


async def test_check_isolation_finds_shared_state():
    shared: dict[str, list[str]] = {"notes": []}  # an environment that forgot per-rollout state

    async def run(marker: str):
        shared["notes"].append(marker)
        await asyncio.sleep(0.01)
        return list(shared["notes"])

    report = await check_isolation(run, runs=2)
    assert not report.isolated
    assert set(report.leaks) == {(0, 1), (1, 0)}
    assert "run 0 saw the state of run 1" in str(report)


async def test_check_isolation_requires_each_run_to_see_its_own_marker():
    async def run(marker: str):
        return {"nothing": "written"}

    report = await check_isolation(run)
    assert not report.isolated and report.saw_own == (False, False)
    with pytest.raises(ValueError, match="runs must be >= 2"):
        await check_isolation(run, runs=1)


def test_describe_tools_accepts_each_kind_and_rejects_duplicates(aircraft):
    def convert(amount: float, currency: str = "USD") -> str:
        """Convert an amount to a currency.

        Longer notes that a listing does not need.
        """
        return f"{amount} {currency}"

    openai_dict = {"type": "function", "function": {"name": "noop", "description": "Nothing.",
                                                    "parameters": {"type": "object", "properties": {}}}}
    specs = describe_tools([aircraft, convert, openai_dict])
    assert [s["name"] for s in specs] == ["get_aircraft", "convert", "noop"]
    assert specs[1] == {
        "name": "convert",
        "description": "Convert an amount to a currency.",
        "parameters": {"type": "object", "properties": {"amount": {"type": "number"}, "currency": {"type": "string"}},
                       "required": ["amount"]},
    }
    with pytest.raises(ValueError, match="two tools are named 'get_aircraft'"):
        describe_tools([aircraft, aircraft.as_function()])
    with pytest.raises(TypeError, match="cannot describe a int"):
        describe_tools([3])


def test_public_api_is_exactly_what_the_package_exports():
    import mtrl_runtime.envs as envs

    public = {name for name in vars(envs) if not name.startswith("_")} - {"annotations"}
    assert set(envs.__all__) == {name for name in public if not inspect.ismodule(getattr(envs, name))}
