"""The TLS context of the runtime's own outgoing HTTP clients (the reference model, the judges).

httpx builds a verified TLS context for every client it makes, whether
the URL is ``http`` or ``https``, and building one loads the CA bundle
(about 20 ms of CPU). The reference client and the judges make a client per
call (a client is bound to the event loop it first ran on, and a judge may
be called from several), so each call paid it. ``client_tls()`` builds the
same context httpx builds by default (certifi's bundle, or the file or
folder named by ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``) once per process:
those variables are read at the first call, not at every request.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def client_tls() -> ssl.SSLContext:
    """httpx's default verified context (``httpx.create_ssl_context()``), built once per process."""
    return httpx.create_ssl_context()


__all__ = ["client_tls"]
