"""The protocols' ``PostRoute`` matches every path exactly as Starlette's ``Route`` (its regular expression) does."""

from __future__ import annotations

import pytest
from starlette.routing import Route

from mtrl_runtime.server.protocols import _endpoint
from mtrl_runtime.server.protocols._endpoint import PostRoute

TEMPLATES = [
    "/v1/chat/completions",
    "/rollouts/{rollout_id}/v1/chat/completions",
    "/v1beta/models/{model}:generateContent",
    "/rollouts/{rollout_id}/v1beta/models/{model}:generateContent",
    "/model/{model_id:path}/converse",
]
PATHS = [
    "/v1/chat/completions", "/v1/chat/completions/", "/v1/chat/completionsX", "/v1/chat/completions\n", "/v1/chat",
    "/rollouts/r1/v1/chat/completions", "/rollouts//v1/chat/completions", "/rollouts/a/b/v1/chat/completions",
    "/rollouts/v1/chat/completions", "/rollouts/r1/v1/chat/completions\n", "/rollouts/r%201/v1/chat/completions",
    "/rollouts/x/v1/chat/completions/v1/chat/completions", "/v1beta/models/gemini-2:generateContent",
    "/v1beta/models/a:generateContent:generateContent", "/v1beta/models/:generateContent",
    "/rollouts/r1/v1beta/models/m:generateContent", "/model/a/b/converse", "/model/a/converse", "",
]


def _app(scope, receive, send):  # never called: only matched
    raise AssertionError


def _scopes():
    for path in PATHS:
        for method in ("POST", "GET"):
            yield {"type": "http", "path": path, "method": method, "root_path": ""}
        yield {"type": "http", "path": path, "method": "POST", "path_params": {"outer": "kept"}}
        yield {"type": "http", "path": "/api" + path, "method": "POST", "root_path": "/api"}
    yield {"type": "websocket", "path": "/v1/chat/completions", "root_path": ""}


@pytest.mark.parametrize("template", TEMPLATES)
def test_post_route_matches_as_starlette_route(template):
    fast = PostRoute(template, _app)
    reference = Route(template, _app, methods=["POST"], include_in_schema=False)
    for scope in _scopes():
        assert fast.matches(scope) == reference.matches(scope), (template, scope)


def test_post_route_skips_the_regular_expression_for_one_segment(monkeypatch):
    """The fast path is taken (the test above would pass on Starlette's own ``matches`` too)."""
    route = PostRoute("/rollouts/{rollout_id}/v1/chat/completions", _app)
    monkeypatch.setattr(Route, "matches", lambda self, scope: pytest.fail("Route.matches called"))
    match, child = route.matches({"type": "http", "path": "/rollouts/r1/v1/chat/completions", "method": "POST",
                                  "root_path": ""})
    assert match.name == "FULL" and child == {"endpoint": _app, "path_params": {"rollout_id": "r1"}}
    assert route.matches({"type": "http", "path": "/v1/chat/completions", "method": "POST"})[0].name == "NONE"


def test_post_router_builds_post_routes():
    router = _endpoint.post_router([("/v1/messages", _app)])
    assert [type(r) for r in router.routes] == [PostRoute]
