"""Wire protocols, one folder each: what a protocol is, served and called, in one place.

A protocol's folder holds its request schema, both translations (serving:
native request -> chat messages, ``ChatResult`` -> native response and
stream events; calling: chat messages -> native request, native reply ->
``ReferenceReply``), its finish-reason and error maps once, and its stream
framing. ``_shared`` holds what every protocol uses.

The server's route for a protocol (``server.protocols``) and the
coordinator's reference client (``coordinator._reference``) import from
here; this package imports neither.
"""

from __future__ import annotations

from ._shared import FinishReasons, ReferenceReply, Wire

__all__ = ["FinishReasons", "ReferenceReply", "Wire"]
