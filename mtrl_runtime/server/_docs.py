"""The published schema and its pages (``/openapi.json``, ``/docs``, ``/redoc``): behind the API key when one is set.

A server bound beyond loopback must have ``advanced.server.api_key``; there a
stranger learns nothing of the routes (every route checks the credential
before it reads a body), and the schema is no exception: without the key its
paths answer 401. Without a key the server listens on loopback only, and the
pages are open as FastAPI serves them. The ``/docs`` page fetches the schema
without credentials, so with a key set, read the schema itself with the key
(``curl -H "Authorization: Bearer $KEY" .../openapi.json``).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import Response

from ..errors import Unauthorized
from ._http import api_key_matches, bearer_token, json_response

SCHEMA_PATH = "/openapi.json"
DOCS_PATH = "/docs"
DOCS_REDIRECT_PATH = "/docs/oauth2-redirect"
REDOC_PATH = "/redoc"


def add_docs_routes(app: FastAPI, api_key: str | None) -> None:
    """Serve the schema and its pages; with ``api_key`` set each needs ``Authorization: Bearer <api key>``.

    Build the app with ``openapi_url=None`` (and no docs URLs) so that these are its only ones.
    """

    def check(request: Request) -> None:
        if api_key and not api_key_matches(bearer_token(request), api_key):
            raise Unauthorized(f"{request.url.path}: this server has an API key (advanced.server.api_key); send "
                               "'Authorization: Bearer <api key>' to read its schema", param="authorization")

    async def schema(request: Request) -> Response:
        check(request)
        return json_response(app.openapi())

    async def swagger(request: Request) -> Response:
        check(request)
        return get_swagger_ui_html(openapi_url=SCHEMA_PATH, title=f"{app.title} - Swagger UI",
                                   oauth2_redirect_url=DOCS_REDIRECT_PATH)

    async def swagger_redirect(request: Request) -> Response:
        check(request)
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc(request: Request) -> Response:
        check(request)
        return get_redoc_html(openapi_url=SCHEMA_PATH, title=f"{app.title} - ReDoc")

    for path, endpoint in ((SCHEMA_PATH, schema), (DOCS_PATH, swagger), (DOCS_REDIRECT_PATH, swagger_redirect),
                           (REDOC_PATH, redoc)):
        app.add_route(path, endpoint, methods=["GET"], include_in_schema=False)


__all__ = ["DOCS_PATH", "REDOC_PATH", "SCHEMA_PATH", "add_docs_routes"]
