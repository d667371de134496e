"""Serving and capturing model calls: prompt, generation, reply, the answer built, and the turn committed last.

A caller passes ``respond``, which turns the ``ChatResult`` into the bytes it
will send (a protocol's response body, or a stream's closing events). It runs
before the turn is committed: an answer that cannot be built (a value the
JSON writer refuses, a tool call the protocol cannot express) fails the call
with nothing recorded, so an agent's retry never leaves a stored turn it did
not see. The commit is the last step that can fail.

``off_loop``: a large request's messages are normalized and its prompt built
on a worker thread, so the event loop keeps serving other calls meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Mapping, Sequence, TypeVar

from ..chat import CHAT_TEMPLATE_META, PromptPlan, find_compaction
from ..chat.formats import ChatFormat, resolve_format
from ..errors import AnswerFailure, BadRequest, Conflict, EngineFailure, MtrlError
from ..roles import RoleMap
from ..seeds import derived_seed, turn_seed
from ..types import (
    BreakReason, ChatOptions, ChatResult, Generation, GenerationRequest, ModelCall, PolicyEngine, SamplingParams,
    StreamingEngine, TrajectoryStore, Turn, TurnLimitHit,
)
from ._call_checks import checked, fit_context
from ._counters import CoordinatorCounters
from ._inflight import stoppable
from ._live import LiveRollout, LiveRollouts, VerifiedToken
from ._owner import call_owner, check_owner
from ._rendering import CallRendering
from ._stream import ChatStream, StreamClosed

_log = logging.getLogger("mtrl.coordinator")


Respond = Callable[[ChatResult], Awaitable[Any]]
"""Builds a call's answer (the bytes its route sends) from its result, before the turn is committed."""


@dataclass(frozen=True)
class PolicyCall:
    """One chat call for the policy, as ``Coordinator.chat`` takes it and ``CallCapture`` serves it.

    ``rollout_id`` None: an unattributed (inference) call; ``token`` the
    caller's credential (a ``VerifiedToken``: a run-wide one). ``messages``,
    ``tools`` and ``options`` are as the caller sent them until
    ``CallCapture.chat`` checks and settles them; ``respond`` None: the
    answer is the ``ChatResult`` itself; ``stream``, ``respond`` and
    ``off_loop`` are explained in the module docstring. Built once per call
    and passed down whole; a step that settles a field (the normalized
    messages, the rollout a run-wide credential's call belongs to, the
    turn's seed) passes on a ``replace``d copy.
    """

    rollout_id: str | None
    token: str | None
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] | None
    sampling: SamplingParams
    options: ChatOptions | None = None
    stream: ChatStream | None = None
    respond: Respond | None = None
    off_loop: bool = False

    def settled(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                options: ChatOptions) -> "PolicyCall":
        """This call with its checked messages, tools and options, every other field kept: built directly, since
        ``dataclasses.replace`` cost a served call about 30,000 instructions (bench/endpoint_trees.py)."""
        return PolicyCall(self.rollout_id, self.token, messages, tools, self.sampling, options, self.stream,
                          self.respond, self.off_loop)


class CallCapture:
    """The coordinator's part that answers chat calls and records each attributed one as a turn."""

    def __init__(
        self,
        engine: PolicyEngine,
        store: TrajectoryStore,
        live: LiveRollouts,
        counters: CoordinatorCounters,
        chat_format: ChatFormat | None = None,
        history_training: str = "extend",
        default_seed: int | None = None,
        background_models: frozenset[str] = frozenset(),
        roles: RoleMap | None = None,
    ) -> None:
        self.engine = engine
        self.roles = roles  # ``advanced.policy_models`` as a mapping: each call's model id names its role
        self.default_seed = default_seed  # the run's ``sampling_params.seed``
        self.background_models = background_models  # ``advanced.server.background_models``
        self.store = store
        self.live = live
        self.counters = counters
        # the model family's format: how prompts render and completions parse (detected when not given)
        self.rendering = CallRendering(engine.tokenizer, chat_format or resolve_format(engine.tokenizer, None),
                                       history_training, counters)
        self.renderer, self.builder = self.rendering.renderer, self.rendering.builder
        # what prompts render with, kept with the run: ``mtrl export`` writes this template beside the trained weights
        store.set_meta(CHAT_TEMPLATE_META, {"chat_format": self.rendering.format.name,
                                            "template": self.renderer.template})

    async def chat(self, call: PolicyCall) -> Any:
        """Serve one chat completion and return ``call.respond``'s answer (by default the ``ChatResult`` itself).

        An attributed call is recorded after its answer is built and before this returns (the module
        docstring). With ``call.stream``, the completion's text goes to it as it is decoded (``_stream``); the
        turn recorded is the same as without.
        """
        options = call.options or _AUTO
        messages, tools = await _work(call.off_loop, checked, call.messages, call.tools, options)
        call = call.settled(messages, tools, options)
        rollout_id, token = call.rollout_id, call.token
        if rollout_id is None:
            if call.sampling.seed is None:
                call = replace(call, sampling=replace(call.sampling, seed=self.default_seed))
            return await self._inference(call)
        if isinstance(token, VerifiedToken):  # a run-wide credential (SageMaker SigV4): the prompt may name the rollout
            rollout_id = call_owner(self.live, rollout_id, messages, self.counters)
            token = VerifiedToken(rollout_id)
            call = replace(call, rollout_id=rollout_id, token=token)
        live = self.live.running(rollout_id, token)
        if options.model is not None and options.model in self.background_models:
            return await self._background(live, call)
        async with live.lock:
            if self.live.get(rollout_id) is None:
                raise Conflict(f"rollout {rollout_id!r} ended while this call waited", param="rollout_id")
            if isinstance(token, VerifiedToken):  # checked under the lock: the rollout's turns are settled
                check_owner(self.live, rollout_id, messages, self.counters)
            if live.turns >= live.max_turns:
                self.live.decide(rollout_id, TurnLimitHit())
                self.counters.turn_limit_hits += 1
                raise Conflict(
                    f"rollout {rollout_id!r} reached max_turns={live.max_turns}; end the episode",
                    param="max_turns",
                )
            if options.unserved_tools:  # hosted tools the call declared, not offered to the policy
                live.unserved_tool_calls += 1
            seed = self._seed(live, call.sampling.seed)
            if seed is not None:  # each turn its own noise (``seeds.turn_seed``)
                call = replace(call, sampling=replace(call.sampling, seed=turn_seed(seed, live.turns)))
            if live.reference is not None:  # an evaluation's reference side: passed through, recorded without ids
                return await self._reference_turn(live, call)
            return await self._attributed_turn(live, call, self._role(live, options.model))

    def _role(self, live: LiveRollout, model: str | None) -> str | None:
        """The role whose model id the call names (``roles``); with roles, a call naming none is refused (400): it
        could only be trained as some role's by a guess."""
        if self.roles is None:
            return None
        role = self.roles.role_of(model)
        if role is None:
            raise BadRequest(
                f"rollout {live.rollout_id!r}: the call names model {model!r}, which is none of this run's roles "
                f"({dict(self.roles.models)!r}, advanced.policy_models); name the model id of the role the call "
                "plays, so its turn trains that role's adapter", param="model")
        return role

    def _seed(self, live: LiveRollout, asked: int | None) -> int | None:
        """The seed a rollout's call samples with: the one the call names (the adapters put the rollout's
        own on every call), else the rollout's (``create_rollout(seed=)``), else one drawn from the run's
        ``sampling_params.seed`` and the rollout id, so two rollouts never share it; None: unseeded."""
        if asked is not None:
            return asked
        if live.seed is not None:
            return live.seed
        return None if self.default_seed is None else derived_seed(self.default_seed, live.rollout_id)

    async def _planned(self, state: Any, call: PolicyCall) -> tuple[PromptPlan, str]:
        """``CallRendering.plan``, on a worker thread for a large request (the renderer's cache is safe to share)."""
        plan, prefix, forced = await _work(call.off_loop, self.rendering.plan, state, call.messages, call.tools,
                                           call.options)
        if forced:
            self.counters.forced_tool_calls += 1
        return plan, prefix

    async def _answer(self, respond: Respond | None, result: ChatResult) -> Any:
        """The caller's answer to ``result`` (``result`` itself without ``respond``), built before anything is
        recorded (see the module docstring).

        A refusal of the caller's own (``MtrlError``) passes as it is; any other failure is an
        ``AnswerFailure`` (500) saying that nothing was recorded, and is logged with its traceback.
        """
        if respond is None:
            return result
        try:
            return await respond(result)
        except (MtrlError, StreamClosed, asyncio.CancelledError):
            raise
        except Exception as exc:
            self.counters.answers_unwritable += 1
            _log.exception("mtrl: the answer to a model call could not be written; nothing was recorded")
            raise AnswerFailure(f"the answer could not be written ({type(exc).__name__}: {exc}); "
                                "nothing was recorded for this call") from exc

    async def _background(self, live: LiveRollout, call: PolicyCall) -> Any:
        """A harness's background call (``background_models``): answered by the engine as an unattributed call,
        recorded as a non-policy model call of the rollout, never a turn (not trained, not its conversation).
        It holds no lock of the rollout, so its end does not wait for it, but the run's stop cancels its
        generation as it cancels the rollout's own call's."""
        started = time.time()
        usage: list[tuple[int, int]] = []
        answer = await stoppable(live, lambda: self._inference(call, usage))  # the run's stop ends it too
        prompt_tokens, completion_tokens = usage[0]
        await self.store.aadd_model_call(ModelCall(
            live.rollout_id, call.options.protocol or "openai", call.options.model, latency_s=time.time() - started,
            started_at=started, input_tokens=prompt_tokens, output_tokens=completion_tokens,
            stream=call.stream is not None,
        ))
        self.counters.background_calls += 1
        return answer

    async def _inference(self, call: PolicyCall, usage: list | None = None) -> Any:
        plan, prefix = await self._planned(None, call)
        tools = call.tools
        sampling = fit_context(self.engine.context_length, len(plan.prompt_ids), call.sampling, self.counters)
        # no rollout: the turn is the replies since the last user message (what a scripted engine's file reads;
        # replies before it belong to worked examples or earlier exchanges)
        turn = 0
        for message in reversed(call.messages):
            if message["role"] == "user":
                break
            turn += message["role"] == "assistant"
        gen = await self._generate(
            GenerationRequest(prompt_ids=plan.prompt_ids, sampling=sampling, turn_index=turn,
                              stop_token_ids=self.renderer.stop_token_ids),
            self.rendering.streaming(call.stream, prefix, tools, sampling, len(plan.prompt_ids)),
        )
        text, message, finish, _, _ = self.rendering.reply(gen, tools, sampling, prefix)
        answer = await self._answer(call.respond, ChatResult(message, finish, plan.prompt_ids, gen, text))
        if usage is None:
            self.counters.inference_calls += 1
        else:
            usage.append((len(plan.prompt_ids), len(gen.completion_ids)))
        return answer

    async def _attributed_turn(self, live: LiveRollout, call: PolicyCall, role: str | None = None) -> Any:
        started = time.time()
        messages, tools = call.messages, call.tools
        live.note_answers(messages)
        state = live.conversation if role is None else live.role_conversations.get(role)  # each role its own
        plan, prefix = await self._planned(state, call)
        if plan.break_reason is not None and role is None:  # compaction is read on the rollout's own conversation
            plan = self._compacted(live, plan, messages)
        sampling = fit_context(self.engine.context_length, len(plan.prompt_ids), call.sampling, self.counters)
        request = GenerationRequest(
            prompt_ids=plan.prompt_ids,
            sampling=sampling,
            adapter=live.policy_version,
            rollout_id=live.rollout_id,
            turn_index=live.turns,
            stop_token_ids=self.renderer.stop_token_ids,  # the format's stop tokens (and eos)
            base_model=live.base_model,
            role=role,
        )
        stream = self.rendering.streaming(call.stream, prefix, tools, sampling, len(plan.prompt_ids))
        gen = await self._generation(live, request, stream)
        text, message, finish, malformed, reasoning_tokens = self.rendering.reply(gen, tools, sampling, prefix)
        if plan.break_reason is not None:
            self.counters.prefix_breaks[plan.break_reason] += 1
        turn = Turn(
            rollout_id=live.rollout_id,
            index=live.turns,
            messages=tuple(messages),
            prompt_ids=plan.prompt_ids,
            completion_ids=gen.completion_ids,
            logprobs=gen.logprobs,
            finish_reason=gen.finish_reason,
            completion_text=text,
            tool_calls=tuple(message.get("tool_calls") or ()),
            tools=tuple(tools),
            policy_version=gen.policy_version,
            token_versions=gen.token_versions,  # a partial rollout: new weights arrived mid-turn
            segment=plan.segment if role is None else live.role_segment(role, plan.segment),
            break_reason=plan.break_reason,
            malformed_tool_call=malformed > 0,
            started_at=started,
            latency_s=time.time() - started,
            reasoning=message.get("reasoning_content"),
            reasoning_tokens=reasoning_tokens,
            role=role,
        )
        conversation = await _work(call.off_loop, self.builder.advance, state, plan, messages, tools,
                                   gen.completion_ids, gen.finish_reason, message)  # pure: nothing changes yet
        answer = await self._answer(call.respond, ChatResult(message, finish, plan.prompt_ids, gen, text))
        await self.store.aadd_turn(turn)  # the last step that can fail; durable before the answer is sent
        if role is None:
            live.previous, live.conversation = live.conversation, conversation
        else:
            live.role_conversations[role] = conversation
        live.note_calls(message.get("tool_calls") or (), tools, turn.index)
        live.turns += 1
        self.counters.count_turns(live.step, 1)
        if sampling.max_tokens_asked is not None:
            live.clamped_turns += 1
            self.counters.max_tokens_clamped += 1
        return answer

    async def _reference_turn(self, live: LiveRollout, call: PolicyCall) -> Any:
        """Answer with the rollout's reference model (``_reference``) and commit the turn, named by its model and
        without token ids (none come from a closed endpoint), before the answer leaves. A streamed call gets the
        whole reply at once."""
        assert live.reference is not None
        messages, tools, options = call.messages, call.tools, call.options
        if options.token_ids:  # nothing to give back: refused before the call leaves, nothing recorded
            raise BadRequest(
                f"rollout {live.rollout_id!r} is answered by the reference model {live.reference.model!r} through its "
                "own endpoint, which returns no token ids or logprobs: leave return_token_ids and logprobs out",
                param="return_token_ids",
            )
        started = time.time()
        live.note_answers(messages)
        if options.template_kwargs:  # the policy's template variables: not sent to another model (``_reference``)
            self.counters.reference_template_kwargs_dropped += 1
        reference = live.reference
        reply = await stoppable(live, lambda: reference.chat(messages, tools, call.sampling, options))
        calls = tuple(reply.message.get("tool_calls") or ())
        turn = Turn(
            rollout_id=live.rollout_id, index=live.turns, messages=tuple(messages), prompt_ids=(), completion_ids=(),
            logprobs=(), finish_reason=reply.finish_reason, completion_text=reply.completion_text, tool_calls=calls,
            tools=tuple(tools), policy_version=live.policy_version, started_at=started,
            latency_s=time.time() - started, reasoning=reply.reasoning, model=live.reference.model,
        )
        generation = Generation((), (), reply.finish_reason, live.policy_version)
        answer = await self._answer(call.respond, ChatResult(reply.message, reply.finish_reason, (), generation,
                                                             reply.completion_text))
        await self.store.aadd_turn(turn)  # the last step that can fail; durable before the answer is sent
        live.note_calls(calls, tools, turn.index)
        live.turns += 1
        self.counters.reference_turns += 1
        return answer

    def _compacted(self, live: LiveRollout, plan: PromptPlan, messages: list[dict]) -> PromptPlan:
        """``plan`` marked ``COMPACTED`` when its request carries the summary the rollout's previous call wrote
        (``chat.find_compaction``); a compaction whose summary no call of the rollout wrote is refused, naming
        the fix: its summary could be neither trained nor linked to the episode."""
        found = find_compaction(live.previous, live.conversation, messages)
        if found is None:
            return plan
        if not found.attributed:
            self.counters.compactions_unattributed += 1
            raise Conflict(
                f"rollout {live.rollout_id!r}: messages[{found.summary_at}] and the rollout's recent messages after "
                "it look like a context compaction (a summary in place of the older history), but no model call of "
                "this rollout wrote that summary, so it can be neither trained nor linked to the episode. Send the "
                "summarization call to the policy inside the rollout: Strands' SummarizingConversationManager "
                "without a summarization_agent (it calls the agent's own model), LangChain's "
                "SummarizationMiddleware(model=<the agent's policy chat model>) (docs/training.md, \"Context "
                "compaction\")",
                param=f"messages[{found.summary_at}]",
            )
        return replace(plan, break_reason=BreakReason.COMPACTED)

    async def _generation(self, live: LiveRollout, request: GenerationRequest, stream: ChatStream | None) -> Generation:
        """``_generate``, which the run's stop cancels (``_inflight.stoppable``)."""
        return await stoppable(live, lambda: self._generate(request, stream))

    async def _generate(self, request: GenerationRequest, stream: ChatStream | None = None) -> Generation:
        try:
            if stream is None:
                return await self.engine.generate(request)
            if isinstance(self.engine, StreamingEngine):
                return await stream.run(self.engine.generate_stream(request))
            return await stream.run(self.engine.generate(request))  # one burst at the end
        except StreamClosed:
            self.counters.streams_closed += 1  # the client hung up: generation stopped, no turn recorded
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the engine failed: the call fails, the server keeps serving
            self.counters.engine_failures += 1
            raise EngineFailure(f"the policy engine failed: {type(exc).__name__}: {exc}") from exc


_AUTO = ChatOptions()
T = TypeVar("T")


async def _work(off_loop: bool, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: on a worker thread for a large request (``off_loop``), else right here."""
    return await asyncio.to_thread(fn, *args) if off_loop else fn(*args)


__all__ = ["CallCapture", "ChatResult", "PolicyCall", "Respond"]
