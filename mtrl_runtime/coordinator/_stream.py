"""One streamed chat call, between the capture that generates it and the route that writes it.

The route hands a ``ChatStream`` to ``Coordinator.chat(..., stream=...)``
and reads text deltas from it while the call runs. The capture starts it
with the completion's ``ReplyText`` once the prompt is planned, and runs the
generation through ``run``: a ``StreamingEngine``'s tokens are decoded into
deltas as they arrive; any other engine's whole ``Generation`` arrives at
once (the burst). Either way the turn is recorded exactly as a non-streamed
call's: ``run`` returns the same ``Generation``.

``close`` (the client hung up) stops the generation at once: ``run`` raises
``StreamClosed`` and the turn is not recorded. A close that comes after the
generation finished changes nothing: the turn is committed.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any, AsyncIterator, Awaitable

from ..chat import ReplyText, TextDelta
from ..types import Generation, TokenDelta


class StreamClosed(Exception):
    """The client of a streamed call hung up while it was generating: the generation stopped, nothing was recorded."""


class ChatStream:
    """Text deltas of one streamed call (see the module docstring)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[TextDelta | None] = asyncio.Queue()
        self.text: ReplyText | None = None
        self.prompt_tokens = 0
        self.closed = False
        self._task: asyncio.Future[Generation] | None = None

    def begin(self, text: ReplyText, prompt_tokens: int) -> None:
        """The call was accepted and its prompt (``prompt_tokens`` long) planned: ``text`` decodes its completion."""
        self.text = text
        self.prompt_tokens = prompt_tokens

    async def run(self, source: AsyncIterator[TokenDelta | Generation] | Awaitable[Generation]) -> Generation:
        """The generation, its tokens decoded into deltas as a streaming ``source`` yields them."""
        if isinstance(source, AsyncIterator):
            self._task = asyncio.ensure_future(self._consume(source))
        else:
            self._task = asyncio.ensure_future(source)
        if self.closed:
            self._task.cancel()
        try:
            return await self._task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.closed and (current is None or not current.cancelling()):
                raise StreamClosed("the client closed the stream while the completion was generated") from None
            raise

    def close(self) -> None:
        """The client is gone: stop a generation in progress (a finished one stays recorded)."""
        self.closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def end(self, _: Any = None) -> None:
        """The call is over (answered or refused): readers get None after the deltas queued before."""
        self._queue.put_nowait(None)

    async def get(self) -> TextDelta | None:
        """The text decoded since the last call, merged (empty: the first token came, its text held back); None at the end."""
        items = [await self._queue.get()]
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        parts = [item for item in items if item is not None]
        if len(parts) < len(items):
            self._queue.put_nowait(None)  # the end stays for the next read
        if not parts:
            return None
        return TextDelta("".join(p.content for p in parts), "".join(p.reasoning for p in parts))

    async def _consume(self, source: AsyncIterator[TokenDelta | Generation]) -> Generation:
        first = True
        async with aclosing(source):  # closing it early stops the engine's row
            async for item in source:
                if isinstance(item, Generation):
                    return item
                if self.text is not None:
                    delta = self.text.feed(item.token_ids)
                    if delta or first:  # the first token opens the answer, even when its text waits
                        self._queue.put_nowait(delta)
                    first = False
        raise RuntimeError("the engine's token stream ended without its Generation")


__all__ = ["ChatStream", "StreamClosed"]
