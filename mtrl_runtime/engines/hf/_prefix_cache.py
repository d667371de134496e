"""Automatic prefix caching: a bounded LRU radix tree of KV states keyed by token ids.

A prompt reuses the keys and values of the longest stretch it shares with
anything stored (a whole entry, or the first tokens of one: KV can be cut
along the sequence), and prefills only the rest. Entries form a radix tree:
an entry holds only the KV of its tokens past its parent, and storing ids
that diverge inside an entry splits it there, so a system prompt shared by
many conversations is held once and becomes its own entry. The budget
counts stored tokens (the sum of the entries' own segments). LRU order keeps
every entry before its ancestors (touching an entry touches its ancestors
after it), so evicting from the old end always removes a leaf.

KV is only valid for the weights that computed it: ``clear()`` drops every
entry and bumps ``epoch``, and a store tagged with an older epoch is
refused, so a row prefilled before a weight change never stores its KV.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Sequence

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values), each [1, H, n, D], no padding
Children = dict[int, list["PrefixEntry"]]  # first token of a child's own segment -> those children


class PrefixEntry:
    """Stored KV of ``ids``: its own segment covers tokens ``start:len(ids)``, its ancestors the rest."""

    __slots__ = ("ids", "parent", "start", "segment", "children", "alive")

    def __init__(self, ids: tuple[int, ...], parent: PrefixEntry | None, segment: KV) -> None:
        self.ids = ids
        self.parent = parent
        self.start = 0 if parent is None else parent.length
        self.segment = segment  # per layer [1, H, len(ids) - start, D]
        self.children: Children = {}
        self.alive = True

    @property
    def length(self) -> int:
        return len(self.ids)

    def states(self, n: int) -> KV:
        """Keys and values of the first ``n`` tokens, per layer [1, H, n, D] (a new tensor)."""
        if not 0 < n <= self.length:
            raise ValueError(f"n: expected 1..{self.length}, got {n}")
        parts, node = [], self
        while node is not None:
            if node.start < n:
                parts.append(node)
            node = node.parent
        parts.reverse()
        return [
            (torch.cat([e.segment[layer][0][:, :, : n - e.start] for e in parts], dim=2),
             torch.cat([e.segment[layer][1][:, :, : n - e.start] for e in parts], dim=2))
            for layer in range(len(self.segment))
        ]


class PrefixCache:
    """Bounded LRU radix tree of ``PrefixEntry`` by token ids (see the module docstring). Thread-safe."""

    def __init__(self, max_tokens: int) -> None:
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"prefix_cache_tokens: expected an int >= 1 (0 disables the cache), got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.tokens = 0  # stored tokens: the sum of the entries' own segments
        self.epoch = 0  # bumped by clear(); stores tagged with an older epoch are refused
        self.evictions = 0
        self._entries: OrderedDict[tuple[int, ...], PrefixEntry] = OrderedDict()  # least recently used first
        self._roots: Children = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, ids: Sequence[int]) -> bool:
        return tuple(ids) in self._entries

    # ------------------------------------------------------------------ reading
    def lookup(self, prompt_ids: Sequence[int]) -> tuple[PrefixEntry, int] | None:
        """The entry sharing the longest first stretch with ``prompt_ids``, and how many tokens to reuse.

        At least one prompt token is left to prefill (the row needs its
        logits), so a stored copy of the whole prompt gives its first n-1
        tokens. Touches the entry and its ancestors.
        """
        prompt = tuple(prompt_ids)
        with self._lock:
            entry, matched, _ = self._walk(prompt)
            n = min(matched, len(prompt) - 1)
            if entry is None or n < 1:
                return None
            self._touch(entry)
            return entry, n

    def match_length(self, prompt_ids: Sequence[int]) -> int:
        """How many tokens of ``prompt_ids`` ``lookup`` would reuse (0 for none); touches nothing."""
        prompt = tuple(prompt_ids)
        with self._lock:
            return max(0, min(self._walk(prompt)[1], len(prompt) - 1))

    def _walk(self, ids: tuple[int, ...]) -> tuple[PrefixEntry | None, int, bool]:
        """(deepest entry matching ``ids``, tokens matched, whether the match covers that whole entry)."""
        node, matched, children = None, 0, self._roots
        while matched < len(ids):
            best, best_key = None, (matched, False)
            for child in children.get(ids[matched], ()):
                common = common_length(ids, child.ids, matched)
                key = (common, common == child.length)  # on a tie, a fully matched child can lead further
                if key > best_key:
                    best, best_key = child, key
            if best is None:
                break
            if not best_key[1]:
                return best, best_key[0], False
            node, matched, children = best, best.length, best.children
        return node, matched, True

    # ------------------------------------------------------------------ writing
    def store(self, ids: Sequence[int], states: KV, epoch: int | None = None) -> bool:
        """Store the KV ``states`` (per layer [1, H, len(ids), D]) of ``ids``; see ``store_from``."""
        if states and states[0][0].shape[2] != len(ids):
            raise ValueError(f"states: {states[0][0].shape[2]} positions for {len(ids)} ids")
        return self.store_from(ids, lambda start: [(k[:, :, start:], v[:, :, start:]) for k, v in states], epoch)

    def store_from(self, ids: Sequence[int], extract: Callable[[int], KV], epoch: int | None = None) -> bool:
        """Store ``ids``; ``extract(start)`` gives the KV of tokens ``start:`` only (what is not held yet).

        Returns whether new tokens were stored. Refused when ``epoch`` is
        older than the cache's or the ids exceed the budget; ids already held
        are touched (a split makes a stored stretch its own entry). Least
        recently used entries are evicted to make room.
        """
        key = tuple(ids)
        with self._lock:
            if (epoch is not None and epoch != self.epoch) or not key or len(key) > self.max_tokens:
                return False
            entry, matched, whole = self._walk(key)
            if entry is not None and not whole:
                entry = self._split(entry, matched)
            if matched == len(key):
                self._touch(entry)
                return False
            segment = [(k.contiguous(), v.contiguous()) for k, v in extract(matched)]
            if segment and segment[0][0].shape[2] != len(key) - matched:
                raise ValueError(f"extract({matched}): {segment[0][0].shape[2]} positions, "
                                 f"expected {len(key) - matched}")
            new = PrefixEntry(key, entry, segment)
            self._siblings(new).append(new)
            self._entries[key] = new
            self.tokens += len(key) - matched
            self._touch(new)
            self._evict_to_budget()
            return True

    def clear(self) -> None:
        """Drop every entry and bump ``epoch`` (the weights changed)."""
        with self._lock:
            for entry in self._entries.values():
                entry.alive = False
            self._entries.clear()
            self._roots = {}
            self.tokens = 0
            self.epoch += 1

    # ------------------------------------------------------------------ internals (lock held)
    def _siblings(self, entry: PrefixEntry) -> list[PrefixEntry]:
        """The list in its parent's children that holds (or will hold) ``entry``."""
        children = self._roots if entry.parent is None else entry.parent.children
        return children.setdefault(entry.ids[entry.start], [])

    def _split(self, entry: PrefixEntry, at: int) -> PrefixEntry:
        """Cut ``entry`` at token ``at`` (inside its own segment): the first part becomes its new parent."""
        cut = at - entry.start
        head = PrefixEntry(entry.ids[:at], entry.parent, [(k[:, :, :cut].clone(), v[:, :, :cut].clone())
                                                          for k, v in entry.segment])
        siblings = self._siblings(entry)
        siblings[siblings.index(entry)] = head
        entry.segment = [(k[:, :, cut:].clone(), v[:, :, cut:].clone()) for k, v in entry.segment]
        entry.parent, entry.start = head, at
        head.children = {entry.ids[at]: [entry]}
        self._entries[head.ids] = head  # after its child in LRU order, as every ancestor is
        self._touch(head)
        return head

    def _touch(self, entry: PrefixEntry) -> None:
        """Mark ``entry`` most recent, then its ancestors, so every entry stays older than its ancestors."""
        node: PrefixEntry | None = entry
        while node is not None:
            self._entries.move_to_end(node.ids)
            node = node.parent

    def _evict_to_budget(self) -> None:
        while self.tokens > self.max_tokens:
            _, entry = self._entries.popitem(last=False)
            if entry.children:  # cannot happen while the order invariant holds
                raise AssertionError(f"prefix cache: evicting an entry with {len(entry.children)} children")
            siblings = self._siblings(entry)
            siblings.remove(entry)
            if not siblings:
                (self._roots if entry.parent is None else entry.parent.children).pop(entry.ids[entry.start])
            entry.alive = False
            self.tokens -= entry.length - entry.start
            self.evictions += 1


def common_length(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the common prefix of ``a`` and ``b``, given they agree on the first ``start`` tokens.

    Binary search over slice comparisons: the comparing happens in C.
    """
    lo, hi = start, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[start:mid] == b[start:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


__all__ = ["KV", "PrefixCache", "PrefixEntry", "common_length"]
