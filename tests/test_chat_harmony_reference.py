"""mtrl's ``harmony`` format (gpt-oss) against OpenAI's own renderer and parser, ``openai-harmony``, offline.

``openai-harmony`` needs the ``o200k_base`` vocabulary; it downloads it
unless ``TIKTOKEN_ENCODINGS_BASE`` names a folder holding
``o200k_base.tiktoken``, and in both cases checks the file's SHA-256. No
download is possible here: the file is rebuilt from the ranks that the
``quicktok-v1`` package ships (its ``o200k.vocab``, derived from tiktoken's
o200k_base), and openai-harmony's own hash check proves it byte-identical.
From the same ranks transformers' ``TikTokenConverter`` builds a fast
tokenizer with gpt-oss's special tokens at gpt-oss's ids: gpt-oss's real
vocabulary, so token ids are compared, not text.

mtrl's template renders every message token-identical to openai-harmony,
history as vLLM hands it to openai-harmony (a call's recipient before its
channel, content type ``json``), tools as openai-harmony's TypeScript
declarations for every JSON-schema construct its renderer knows.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import importlib.util
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

harmony = pytest.importorskip("openai_harmony", reason="openai-harmony is in the dev extra")

from _groups import one_worker  # noqa: E402
from mtrl_runtime.chat import ChatRenderer, ReplyText, normalize_messages, normalize_tools  # noqa: E402
from mtrl_runtime.chat.formats import HARMONY, detect_format  # noqa: E402
from mtrl_runtime.testing_formats import answer_text, call_text  # noqa: E402

pytestmark = one_worker(__name__)  # the o200k vocabulary, openai-harmony's encoding and the tokenizer, built once

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # what openai-harmony checks
# o200k_base's pre-tokenizer pattern, as openai-harmony (and tiktoken) define it
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+",
])
# gpt-oss's special tokens from id 199998 on (o200k_harmony); the others in this range are reserved
HARMONY_SPECIALS = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
                    200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>",
                    200012: "<|call|>"}

TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Look up a key", "parameters": {
        "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the manual", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["query"]}}},
]
NESTED = {"query": {"filters": [{"field": "naïve café ☕", "values": [1, 2.5, None, True]}]}, "note": "ünïcödé — 漢字"}
CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "A1"}'}}
CALL2 = {"id": "c2", "type": "function", "function": {"name": "search", "arguments": json.dumps(NESTED, ensure_ascii=False)}}
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "instructions_only": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}], None),
    "tools_without_instructions": ([{"role": "user", "content": "Value of A1?"}], TOOLS),
    "calls_and_results_keep_this_turns_analysis": ([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Value of A1? Then search the manual."},
        {"role": "assistant", "content": "", "reasoning_content": "Need both tools.", "tool_calls": [CALL, CALL2]},
        {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "42"},
        {"role": "tool", "tool_call_id": "c2", "name": "search", "content": '{"hits": ["p. 7"]}'},
    ], TOOLS),
    "a_finished_turns_analysis_is_dropped": ([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Value of A1?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "42"},
        {"role": "assistant", "content": "It is 42.", "reasoning_content": "Got it."},
        {"role": "user", "content": "And twice that, in wörds?"},
    ], TOOLS),
}


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding o200k_base.tiktoken, rebuilt from quicktok-v1's bundled ranks."""
    spec = importlib.util.find_spec("quicktok")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("quicktok-v1 (the dev extra) ships the o200k ranks openai-harmony needs offline")
    data = (Path(list(spec.submodule_search_locations)[0]) / "data" / "o200k.vocab").read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)  # then per token: u16 length, the bytes, u32 rank
    pos, ranks = 4, []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, pos)
        token = data[pos + 2 : pos + 2 + length]
        (rank,) = struct.unpack_from("<I", data, pos + 2 + length)
        ranks.append((rank, token))
        pos += 6 + length
    text = b"".join(base64.b64encode(token) + b" %d\n" % rank for rank, token in sorted(ranks))
    assert hashlib.sha256(text).hexdigest() == O200K_SHA256, "quicktok's o200k ranks are not tiktoken's o200k_base"
    folder = tmp_path_factory.mktemp("tiktoken")
    (folder / "o200k_base.tiktoken").write_bytes(text)
    return folder


@pytest.fixture(scope="module")
def enc(vocab_dir: Path) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(vocab_dir))  # read (and hash-checked) once, at load
        return harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)


def _converted(vocab_dir: Path, specials: list[str]) -> Any:
    """transformers' ``TikTokenConverter`` over the o200k ranks: a ``tokenizers.Tokenizer`` (minutes of CPU)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    return TikTokenConverter(
        vocab_file=str(vocab_dir / "o200k_base.tiktoken"), pattern=O200K_PATTERN, extra_special_tokens=specials
    ).converted()


def _converted_once(pytestconfig: pytest.Config, vocab_dir: Path, specials: list[str]) -> Any:
    """``_converted``, kept in pytest's cache folder: built by the first worker, read by every later one.

    The conversion merges 200k ranks in Python: about 130 s of CPU on the
    2-core machine, once per xdist worker that ran a test of this module.
    Its output depends only on its inputs (the ranks, whose hash the vocabulary
    fixture checked, the pattern, the specials) and on the two libraries'
    versions, which together key the cached ``tokenizer.json``; a lock makes a
    second worker wait for the first rather than convert again.
    """
    import tokenizers
    import transformers
    from tokenizers import Tokenizer

    cache = getattr(pytestconfig, "cache", None)
    if cache is None:  # the cache plugin is off
        return _converted(vocab_dir, specials)
    key = hashlib.sha256(json.dumps([O200K_SHA256, O200K_PATTERN, specials, transformers.__version__,
                                     tokenizers.__version__]).encode()).hexdigest()[:16]
    folder = Path(cache.mkdir("mtrl-harmony-tokenizer"))
    saved = folder / f"{key}.json"
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not saved.exists():
            staging = folder / f"{key}.json.tmp-{os.getpid()}"
            _converted(vocab_dir, specials).save(str(staging))
            staging.rename(saved)  # atomic: a reader never sees half a file
    return Tokenizer.from_file(str(saved))


@pytest.fixture(scope="module")
def tok(pytestconfig: pytest.Config, vocab_dir: Path) -> Any:
    """gpt-oss's vocabulary as a transformers fast tokenizer, mtrl's harmony template as its chat template."""
    from transformers import PreTrainedTokenizerFast

    specials = [HARMONY_SPECIALS.get(i, f"<|reserved_{i}|>") for i in range(199998, 200014)]
    backend = _converted_once(pytestconfig, vocab_dir, specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|startoftext|>", eos_token="<|return|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = HARMONY.template
    return tokenizer


@pytest.fixture(scope="module")
def renderer(tok: Any) -> ChatRenderer:
    return ChatRenderer(tok, fallback=HARMONY.template, stop_tokens=HARMONY.stop_tokens)


def test_the_tokenizer_is_gpt_oss_vocabulary_and_stops_where_openai_harmony_stops(enc, tok, renderer):
    text = "Héllo wörld 1234567 漢字 ☕\n\n  def f(x):\n\treturn {\"a\": [1, 2.5]}  // ok's\r\n"
    assert tok.encode(text, add_special_tokens=False) == enc.encode(text)
    for token_id, token in HARMONY_SPECIALS.items():
        assert tok.convert_tokens_to_ids(token) == token_id == enc.encode(token, allowed_special="all")[0]
    assert detect_format(tok) is HARMONY
    stops = set(enc.stop_tokens_for_assistant_actions())  # <|return|>, <|call|>
    assert set(tok.convert_tokens_to_ids(list(HARMONY.stop_tokens))) == stops
    assert stops <= renderer.stop_token_ids and tok.convert_tokens_to_ids("<|end|>") not in renderer.stop_token_ids


# ------------------------------------------------------------------------------------------------ rendering
def _reference_conversation(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Any:
    """The same conversation as openai-harmony's Messages (its defaults: reasoning medium)."""
    H = harmony
    out = [H.Message.from_role_and_content(H.Role.SYSTEM, H.SystemContent.new())]
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    if system or tools:
        dev = H.DeveloperContent.new()
        if system:
            dev = dev.with_instructions(system)
        if tools:
            dev = dev.with_function_tools([
                H.ToolDescription.new(t["function"]["name"], t["function"].get("description", ""),
                                      parameters=t["function"].get("parameters")) for t in tools])
        out.append(H.Message.from_role_and_content(H.Role.DEVELOPER, dev))
    for m in messages[1:] if system else messages:
        if m["role"] == "user":
            out.append(H.Message.from_role_and_content(H.Role.USER, m["content"]))
        elif m["role"] == "tool":
            author = H.Author.new(H.Role.TOOL, "functions." + m["name"])
            out.append(H.Message.from_author_and_content(author, m["content"]).with_channel("commentary")
                       .with_recipient("assistant"))
        else:
            if m.get("reasoning_content"):
                out.append(H.Message.from_role_and_content(H.Role.ASSISTANT, m["reasoning_content"]).with_channel("analysis"))
            for call in m.get("tool_calls") or []:
                # as vLLM's chat completions (harmony_utils) pass a history call to openai-harmony: content type
                # "json" (the model writes "<|constrain|>json"; gpt-oss's hub template also renders "json")
                fn = call["function"]
                out.append(H.Message.from_role_and_content(H.Role.ASSISTANT, fn["arguments"]).with_channel("commentary")
                           .with_recipient("functions." + fn["name"]).with_content_type("json"))
            if not m.get("tool_calls"):
                out.append(H.Message.from_role_and_content(H.Role.ASSISTANT, m["content"]).with_channel("final"))
    return H.Conversation.from_messages(out)


def _split_messages(ids: list[int], start_id: int) -> list[list[int]]:
    cuts = [i for i, t in enumerate(ids) if t == start_id] + [len(ids)]
    assert cuts[0] == 0
    return [ids[a:b] for a, b in zip(cuts, cuts[1:])]


@pytest.mark.parametrize("case", sorted(CONVERSATIONS))
def test_prompts_are_openai_harmony_token_ids_message_by_message(enc, tok, renderer, case):
    messages, tools = CONVERSATIONS[case]
    ours = renderer.encode(renderer.render(normalize_messages(messages), normalize_tools(tools) if tools else None))
    reference = enc.render_conversation_for_completion(_reference_conversation(messages, tools), harmony.Role.ASSISTANT)
    start = tok.convert_tokens_to_ids("<|start|>")
    ours_m, ref_m = _split_messages(ours, start), _split_messages(reference, start)
    assert [renderer.decode(m[:2]) for m in ours_m] == [enc.decode(m[:2]) for m in ref_m]  # same authors, same order
    for mine, theirs in zip(ours_m, ref_m):
        assert mine == theirs, f"mtrl renders {renderer.decode(mine)!r}, openai-harmony {enc.decode(theirs)!r}"
    assert ours == reference and len(ref_m) >= 3 + bool(tools)  # system, (developer,) user, the generation prompt


def _fn(name: str, description: str | None, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    fn.update({k: v for k, v in (("description", description), ("parameters", parameters)) if v is not None})
    return {"type": "function", "function": fn}


def _obj(properties: dict[str, Any], **rest: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **rest}


# every construct openai-harmony's json_schema_to_typescript renders (encoding.rs, 0.0.8), grouped by kind
SCHEMA_TOOLS: dict[str, list[dict[str, Any]]] = {
    "scalars_enums_defaults_and_comments": [_fn("weather", "Get the weather.\nTwo lines,\r\n\nand a blank one.\n", _obj({
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius", "description": "The unit"},
        "mode": {"type": "string", "default": 'fast "q"'},
        "count": {"type": "integer", "default": 3, "title": "Count", "description": "How many", "examples": ["1", 2]},
        "ratio": {"type": "number", "default": 0.5, "nullable": True},
        "flag": {"type": "boolean", "default": False},
        "opt": {"type": ["string", "null", "integer"]},
        "enum_int": {"type": "string", "enum": [1, 2]},
        "free": {"description": "no type"}, "nothing": {"type": "null"}, "any_of": {"anyOf": [{"type": "string"}]},
        "dflt_obj": {"type": "object", "default": {"a": [1, 2.5], "b": None, "ü": "ß"}},
        "uni": {"type": "string", "description": "ünïcödé — 漢字 ☕"},
    }, required=["unit", 1]))],
    "arrays_and_nested_objects": [_fn("nest", "Nested.", _obj({
        "tags": {"type": "array", "items": {"type": "string"}}, "loose": {"type": "array"},
        "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "objs": {"type": "array", "items": _obj({"x": {"type": "number"}})},
        "nested": _obj({"a": {"type": "string", "description": "inner"}, "b": _obj({"c": {"type": "boolean"}},
                       required=["c"])}, description="Nested obj", required=["a"]),
        "odd": True, "items": {"type": "string"},
    }, description="Top level", required=["nested"]))],
    "one_of_unions": [_fn("pick", "Pick.", _obj({
        "choice": {"description": "Pick one", "default": "a", "oneOf": [
            {"type": "string", "description": "Pick one"}, {"type": "integer", "description": "a number", "default": 5},
            {"type": "string", "enum": ["x", "y"], "default": "x", "nullable": True}]},
        "other": {"description": "Other", "oneOf": [{"type": "string", "description": "as text"}, _obj({"k": {"type": "string"}})]},
        "either": {"oneOf": [{"type": "boolean"}, {"type": "null"}], "default": None},
        "deep": _obj({"inner": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"oneOf": [
            {"type": "string"}, {"type": "number"}]}}]}}),
    }, required=["choice"])), _fn("top", "Top-level oneOf.", {"oneOf": [
        _obj({"a": {"type": "string"}}, description="first"), _obj({"b": {"type": "integer"}}, default="z"),
        {"type": "string", "enum": ["e1"], "default": "e1", "nullable": True}]})],
    "without_parameters_or_description": [_fn("ping", "No parameters."), _fn("bare", None, _obj({})),
                                          _fn("empty", "", {"type": "object"})],
}


@pytest.mark.parametrize("case", sorted(SCHEMA_TOOLS))
def test_tool_schemas_render_as_openai_harmony_typescript(enc, renderer, case):
    tools = SCHEMA_TOOLS[case]
    messages = [{"role": "user", "content": "Hi"}]
    ours = renderer.encode(renderer.render(normalize_messages(messages), normalize_tools(tools)))
    reference = enc.render_conversation_for_completion(_reference_conversation(messages, tools), harmony.Role.ASSISTANT)
    assert renderer.decode(ours) == enc.decode(reference)  # a readable diff first
    assert ours == reference


# -------------------------------------------------------------------------------------------------- parsing
def _completion(enc: Any, messages: list[Any]) -> list[int]:
    """The ids a gpt-oss model samples after the prompt's ``<|start|>assistant``, as openai-harmony renders them."""
    ids = [t for m in messages for t in enc.render(m)]
    head = enc.encode("<|start|>assistant", allowed_special="all")
    assert ids[: len(head)] == head
    ids = ids[len(head):]
    if ids[-1] == enc.encode("<|end|>", allowed_special="all")[0]:  # a final answer ends the turn with <|return|>
        ids[-1] = enc.encode("<|return|>", allowed_special="all")[0]
    return ids


def _assistant(text: str, channel: str, recipient: str | None = None) -> Any:
    msg = harmony.Message.from_role_and_content(harmony.Role.ASSISTANT, text).with_channel(channel)
    return msg.with_recipient(recipient).with_content_type("<|constrain|>json") if recipient else msg


def test_mtrl_parses_what_openai_harmony_renders_as_a_completion(enc, renderer):
    cases = [
        ([_assistant("User wants A1.", "analysis"), _assistant('{"key": "A1"}', "commentary", "functions.lookup")],
         None, "User wants A1.", [("lookup", {"key": "A1"})]),
        ([_assistant("Think it over.", "analysis"), _assistant("It is 42, naïvely ☕.", "final")],
         "It is 42, naïvely ☕.", "Think it over.", []),
        ([_assistant("Deployment's history order.", "analysis"),
          harmony.Message.from_role_and_content(harmony.Role.ASSISTANT, '{"key": "A1"}').with_channel("commentary")
          .with_recipient("functions.lookup").with_content_type("json")],
         None, "Deployment's history order.", [("lookup", {"key": "A1"})]),
        ([_assistant("Checking two sources.", "commentary"),
          _assistant('{"key": "A1"}', "commentary", "functions.lookup"),
          _assistant(json.dumps(NESTED, ensure_ascii=False), "commentary", "functions.search")],
         "Checking two sources.", None, [("lookup", {"key": "A1"}), ("search", NESTED)]),
    ]
    for messages, content, reasoning, calls in cases:
        parsed = HARMONY.parse(renderer.decode(_completion(enc, messages)), ["lookup", "search"])
        assert (parsed.content, parsed.reasoning) == (content, reasoning)
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == calls
        assert parsed.malformed == 0 and parsed.unknown_tools == 0


def _reference_parse(enc: Any, tok: Any, text: str) -> list[tuple[str | None, str | None, str]]:
    ids = tok.encode(text, add_special_tokens=False)
    return [(m.channel, m.recipient, m.content[0].text)
            for m in enc.parse_messages_from_completion_tokens(ids, harmony.Role.ASSISTANT)]


def test_openai_harmony_parses_what_mtrl_takes_a_gpt_oss_model_to_write(enc, tok):
    """testing_formats' harmony texts (the scripted engine's gpt-oss replies) and the forced call prefix are real harmony."""
    assert _reference_parse(enc, tok, answer_text("harmony", "It is 42.", "Need nothing.") + "<|return|>") == [
        ("analysis", None, "Need nothing."), ("final", None, "It is 42.")]
    calls = [("lookup", {"key": "A1"}), ("search", NESTED)]
    assert _reference_parse(enc, tok, call_text("harmony", calls, "Checking.")) == [
        ("commentary", None, "Checking."),
        ("commentary", "functions.lookup", '{"key": "A1"}'),
        ("commentary", "functions.search", json.dumps(NESTED, ensure_ascii=False)),
    ]
    forced = HARMONY.forced_prefix("lookup") + '{"key": "A1"}<|call|>'
    assert _reference_parse(enc, tok, forced) == [("commentary", "functions.lookup", '{"key": "A1"}')]
    assert _reference_parse(enc, tok, HARMONY.forced_prefix(None) + 'search <|constrain|>json<|message|>{}<|call|>') == [
        ("commentary", "functions.search", "{}")]


@pytest.mark.parametrize("calls", [False, True])
def test_streamed_text_never_runs_ahead_of_openai_harmony_streamable_parser(enc, tok, renderer, calls):
    reasoning, content = "First the manual, then the gauge: ünits matter.", "The gauge reads 42 psi — inside limits."
    if calls:  # a preamble (content) before a call: the call never streams
        text = call_text("harmony", [("lookup", {"key": "A1"})], content)
    else:
        text = answer_text("harmony", content, reasoning) + "<|return|>"
    parser = harmony.StreamableParser(enc, role=harmony.Role.ASSISTANT)
    reply = ReplyText(HARMONY, renderer, "", calls, ())
    seen: dict[tuple[str | None, str | None], str] = {}
    for token in tok.encode(text, add_special_tokens=False):
        parser.process(token)
        if parser.last_content_delta:
            key = (parser.current_channel, parser.current_recipient)
            seen[key] = seen.get(key, "") + parser.last_content_delta
        reply.feed([token])
        assert (seen.get(("final", None), "") + seen.get(("commentary", None), "")).startswith(reply.content)
        assert seen.get(("analysis", None), "").startswith(reply.reasoning)
    final = HARMONY.parse(renderer.decode(tok.encode(text, add_special_tokens=False)), calls=calls).to_message()
    rest, exact = reply.remainder(final)
    assert exact and reply.content + rest.content == content
    assert reply.reasoning + rest.reasoning == ("" if calls else reasoning)
    assert len(rest.content) <= 1 and reply.content  # it streamed as it went, not at the end
    if calls:
        assert seen[("commentary", "functions.lookup")] == '{"key": "A1"}' and [
            c["function"]["name"] for c in final["tool_calls"]] == ["lookup"]


@pytest.mark.parametrize("preamble", [False, True])
def test_a_call_written_recipient_first_never_streams_as_content(enc, tok, renderer, preamble):
    """openai-harmony's order of a call's header (the order the history shows calls in) streams nothing of the call."""
    call = _assistant('{"key": "A1"}', "commentary", "functions.lookup")
    messages = [_assistant("Checking the table.", "commentary"), call] if preamble else [call]
    ids = _completion(enc, messages)
    assert renderer.decode(ids).startswith("<|channel|>commentary<|message|>" if preamble else " to=functions.lookup<|channel|>")
    reply = ReplyText(HARMONY, renderer, "", True, ())
    for token in ids:
        reply.feed([token])
        assert reply.content == ("Checking the table."[: len(reply.content)] if preamble else "")
    final = HARMONY.parse(renderer.decode(ids), ["lookup"]).to_message()
    rest, exact = reply.remainder(final)
    assert exact and reply.content + rest.content == ("Checking the table." if preamble else "")
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in final["tool_calls"]] == [("lookup", '{"key": "A1"}')]


# ------------------------------------------------------------------------------------------------ extension
def test_a_turn_extends_after_call_and_after_return_in_openai_harmony_ids(enc, tok):
    """After ``<|call|>`` the next prompt is the model's ids + the result's, openai-harmony's rendering id for id;
    after ``<|return|>`` (history: ``<|end|>``) ``extend`` adds the new user turn's ids only, ``deployed`` re-renders."""
    from mtrl_runtime.chat import PromptBuilder
    from mtrl_runtime.types import BreakReason

    renderer = ChatRenderer(tok, fallback=HARMONY.template, stop_tokens=HARMONY.stop_tokens,
                            history_terminators=HARMONY.history_terminators)
    deployed, extend = PromptBuilder(renderer, "deployed"), PromptBuilder(renderer, "extend")
    messages, tools = CONVERSATIONS["a_finished_turns_analysis_is_dropped"]
    H = harmony

    def reference(msgs: list[dict[str, Any]]) -> tuple[int, ...]:
        return tuple(enc.render_conversation_for_completion(_reference_conversation(msgs, tools), H.Role.ASSISTANT))

    def turn(builder, state, request, completion):
        plan = builder.build(state, request, tools)
        reply = HARMONY.parse(renderer.decode(completion), ["lookup", "search"]).to_message()
        return plan, builder.advance(state, plan, request, tools, completion, "stop", reply)

    call = H.Message.from_role_and_content(H.Role.ASSISTANT, '{"key": "A1"}').with_channel("commentary") \
        .with_recipient("functions.lookup").with_content_type("json")  # the order deployment renders it in
    completion0 = _completion(enc, [_assistant("Need the tool.", "analysis"), call])
    assert renderer.decode(completion0[-1:]) == "<|call|>"
    plan0, state0 = turn(deployed, None, messages[:2], completion0)
    plan1, state1 = turn(deployed, state0, messages[:4], _completion(enc, [_assistant("Got it.", "analysis"),
                                                                          _assistant("It is 42.", "final")]))
    assert plan1.break_reason is None and plan1.prompt_ids[: len(state0.context_ids)] == state0.context_ids
    assert plan1.prompt_ids == reference(messages[:4])  # no break, no token added after <|call|>
    assert renderer.decode(state1.context_ids[-1:]) == "<|return|>"
    follow = deployed.build(state1, messages, tools)
    assert follow.break_reason is BreakReason.REPLY_RENDERED_DIFFERENTLY and follow.prompt_ids == reference(messages)
    kept = extend.build(state1, messages, tools)
    assert kept.break_reason is None and kept.prompt_ids[: len(state1.context_ids)] == state1.context_ids
    assert kept.prompt_ids[len(state1.context_ids):] == tuple(enc.encode(
        "<|start|>user<|message|>And twice that, in wörds?<|end|><|start|>assistant", allowed_special="all"))
