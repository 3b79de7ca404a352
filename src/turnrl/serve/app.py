"""The HTTP face of the gateway: an OpenAI-compatible Starlette (ASGI) app.

Routes (``PREFIX`` is empty, ``/rollouts/{rollout_id}``,
``/tasks/{task_id}/rollouts/{rollout_id}``, either followed by ``/secret/{secret}``,
or Agent Lightning's
``/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai``, so an
unmodified OpenAI client can carry the ids in its ``base_url``)::

    POST PREFIX/v1/chat/completions        sample one turn (OpenAI schema)
    GET  PREFIX/v1/models                  the served model
    POST PREFIX/v1/reward                  final reward (PREFIX non-empty)
    POST /v1/rollouts/{rollout_id}/reward  final reward: {"reward": 1.0, "task_id": "..."}
    POST /api/rollouts/{rollout_id}/attempt/{attempt_id}/events
                                           Agent Lightning's event route (AGL_EVENT_URL):
                                           {"event_type": "reward", "data": {"value": 1.0}}
    GET  /v1/rollouts/{rollout_id}         a rollout's summary and turn records
    GET  /v1/rollouts                      summaries of all rollouts (unless list_rollouts=False)
    GET  /health                           liveness and counters
    POST /admin/reload                     {"policy": DIR}: serve another policy directory
                                           (only when the app has a loader; loopback callers only)

Without a path prefix the ids come from the ``X-Rollout-Id`` and ``X-Task-Id``
headers (a path and a header that disagree are a 400). The reward routes also
accept Agent Lightning's reward event as the body.

A rollout opened by the training loop has a secret (:meth:`Gateway.open_rollout`):
a call or reward naming it must carry it, in ``/secret/{secret}``, as Agent
Lightning's ``attempt_id``, or in the ``X-Rollout-Secret`` header. A refused
chat call is remembered on its rollout (the agent loop reports it when the
agent then fails). The key, browser and ``Host`` checks wrap this app
(:mod:`turnrl.serve.guard`).

Every error is an OpenAI-style body ``{"error": {"message", "type", "param",
"code"}}``; unexpected failures are logged on the server (logger
``turnrl.serve``) and answered with a bare 500, never a traceback. Gateway calls
run in worker threads so the event loop stays responsive while sampling.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from turnrl.serve.errors import GatewayError, bad_request, error_body
from turnrl.serve.gateway import Gateway, check_reward
from turnrl.serve.jsonbody import decode_json
from turnrl.serve.net import is_loopback
from turnrl.serve.protocol import parse_chat_request
from turnrl.serve.responses import stream_chunks
from turnrl.types import Policy

logger = logging.getLogger("turnrl.serve")

AGL_PREFIX = "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai"
"""Agent Lightning's LLM proxy path (its ``AGL_OPENAI_BASE_URL`` minus ``/v1``)."""

PREFIXES = (
    "",
    "/rollouts/{rollout_id}",
    "/tasks/{task_id}/rollouts/{rollout_id}",
    "/rollouts/{rollout_id}/secret/{secret}",
    "/tasks/{task_id}/rollouts/{rollout_id}/secret/{secret}",
    AGL_PREFIX,
)
"""Path prefixes that carry the rollout (and task) id, and the rollout's secret, for
``base_url``-only clients."""

AGL_EVENTS = "/api/rollouts/{rollout_id}/attempt/{attempt_id}/events"
"""Agent Lightning's event route (its ``AGL_EVENT_URL``)."""

ROLLOUT_HEADER = "X-Rollout-Id"
TASK_HEADER = "X-Task-Id"
SECRET_HEADER = "X-Rollout-Secret"

Endpoint = Callable[[Request], Awaitable[Response]]


def _error_response(exc: GatewayError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _guarded(handler: Endpoint) -> Endpoint:
    """Turn GatewayErrors into their response, anything else into a logged bare 500."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except GatewayError as exc:
            return _error_response(exc)
        except Exception:
            logger.exception("unhandled error in %s %s", request.method, request.url.path)
            return JSONResponse(error_body(500, "internal server error"), status_code=500)

    endpoint.__name__ = handler.__name__
    return endpoint


def _id_from(request: Request, path_key: str, header: str) -> str | None:
    """An id from the path or the header; both given and different is a 400."""
    in_path = request.path_params.get(path_key)
    in_header = request.headers.get(header)
    if in_path is not None and in_header is not None and in_path != in_header:
        raise bad_request(f"{header} {in_header!r} differs from the path's {in_path!r}", header)
    return in_path if in_path is not None else in_header


def _secret_of(request: Request) -> str:
    """The rollout secret the request carries (``""`` when none): the path's
    ``secret``, Agent Lightning's ``attempt_id``, or the ``X-Rollout-Secret`` header."""
    params = request.path_params
    found = params.get("secret", params.get("attempt_id"))
    return found if found is not None else request.headers.get(SECRET_HEADER, "")


async def _read_body(request: Request, limit: int, why: str) -> bytearray:
    """The raw body; 413 as soon as it passes ``limit`` bytes (``why`` says whence);
    400 when the client goes away before sending all of it (no answer reaches it)."""
    raw = bytearray()
    try:
        async for chunk in request.stream():
            if len(raw) + len(chunk) > limit:
                raise GatewayError(413, f"request body over {limit} bytes ({why})")
            raw += chunk
    except ClientDisconnect:
        raise bad_request("the client disconnected before sending the whole body") from None
    return raw


def reward_of(body: Any) -> tuple[float, str | None]:
    """The reward and optional task id of a reward body: ``{"reward": x, "task_id": ...}``
    or Agent Lightning's event ``{"event_type": "reward", "data": {"value": x}}``."""
    if not isinstance(body, dict):
        raise bad_request('the body must be a JSON object like {"reward": 1.0}')
    if "event_type" in body:
        if body["event_type"] != "reward":
            raise bad_request(
                f"event_type must be 'reward' here, got {body['event_type']!r}", "event_type"
            )
        data = body.get("data")
        if not isinstance(data, dict) or "value" not in data:
            raise bad_request('a reward event needs data: {"value": 1.0}', "data.value")
        return check_reward(data["value"], "data.value"), None
    if "reward" not in body:
        raise bad_request('reward is required: {"reward": 1.0}', "reward")
    task_id = body.get("task_id")
    return check_reward(body["reward"]), task_id


def _sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    """Server-sent events: one ``data:`` line per chunk, then ``[DONE]``."""

    async def events() -> AsyncIterator[str]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def create_app(
    gateway: Gateway,
    *,
    max_body_bytes: int = 16 * 2**20,
    max_threads: int = 256,
    reload: Callable[[str], Policy] | None = None,
    list_rollouts: bool = True,
) -> Starlette:
    """The ASGI app serving ``gateway``.

    ``max_body_bytes`` caps a request body (413 past it); ``max_threads`` caps
    the worker threads that wait on sampling or on a busy rollout (more
    concurrent requests queue). ``reload`` loads a policy directory for
    ``POST /admin/reload`` (no such route without it). ``list_rollouts=False``
    leaves out ``GET /v1/rollouts`` (so agents cannot list each other's ids).
    """
    limiters: list[anyio.CapacityLimiter] = []

    async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
        if not limiters:  # created inside the event loop, on first use
            limiters.append(anyio.CapacityLimiter(max_threads))
        return await anyio.to_thread.run_sync(fn, *args, limiter=limiters[0])

    async def _json_body(request: Request) -> Any:
        """The decoded body (decoded in a worker thread: a large body would stall the
        event loop). 413 past the body cap, or past the largest body that can hold
        a request the context admits; 400 when it is not JSON or holds an integer
        too large for any field (:mod:`turnrl.serve.jsonbody`)."""
        limit, why = max_body_bytes, "the body cap"
        fitting = gateway.max_body_bytes
        if fitting is not None and fitting < limit:
            limit = fitting
            why = f"no request of at most {gateway.max_request_chars} characters is larger"
        raw = await _read_body(request, limit, why)
        return await in_thread(decode_json, raw)

    async def chat_completions(request: Request) -> Response:
        rollout_id = _id_from(request, "rollout_id", ROLLOUT_HEADER)
        secret = _secret_of(request)
        try:
            task_id = _id_from(request, "task_id", TASK_HEADER)
            body = await _json_body(request)
            chat = parse_chat_request(body)
            if rollout_id is None:
                raise bad_request(
                    f"no rollout id: send the {ROLLOUT_HEADER} header or use base_url "
                    "http://HOST:PORT/rollouts/ROLLOUT_ID/v1",
                    ROLLOUT_HEADER,
                )
            result = await in_thread(
                functools.partial(gateway.complete, chat, rollout_id, task_id, secret=secret)
            )
        except GatewayError as exc:
            if rollout_id is not None and 400 <= exc.status < 500:
                gateway.registry.note_refusal(rollout_id, secret, exc)
            raise
        if chat.stream:
            return _sse(stream_chunks(result, include_usage=chat.include_usage))
        return JSONResponse(result)

    async def reward(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        value, in_body = reward_of(await _json_body(request))
        task_id = _id_from(request, "task_id", TASK_HEADER)
        if task_id is not None and in_body is not None and in_body != task_id:
            raise bad_request(f"task_id {in_body!r} differs from {task_id!r}", "task_id")
        task_id = task_id if task_id is not None else in_body
        post = functools.partial(
            gateway.reward, rollout_id, value, task_id, secret=_secret_of(request)
        )
        return JSONResponse(await in_thread(post))

    async def event(request: Request) -> Response:
        """Agent Lightning's event route: a reward finishes the rollout; other
        events are acknowledged and not recorded."""
        rollout_id = request.path_params["rollout_id"]
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("event_type"), str):
            raise bad_request("an event is an object with a string event_type", "event_type")
        answer = {"event_type": body["event_type"], "rollout_id": rollout_id}
        await in_thread(gateway.registry.check_access, rollout_id, _secret_of(request))
        if body["event_type"] != "reward":
            return JSONResponse({**answer, "recorded": False})
        value, _ = reward_of(body)
        post = functools.partial(gateway.reward, rollout_id, value, secret=_secret_of(request))
        summary = await in_thread(post)
        return JSONResponse({**answer, "recorded": True, "rollout": summary})

    async def reload_policy(request: Request) -> Response:
        """``{"policy": DIR, "version": N}``: load a policy directory and serve it."""
        assert reload is not None
        client = request.client.host if request.client is not None else ""
        if not is_loopback(client):
            raise GatewayError(403, "/admin/reload is for loopback callers only")
        body = await _json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("policy"), str):
            raise bad_request('send {"policy": "DIRECTORY"}', "policy")
        version = body.get("version", gateway.policy_version + 1)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise bad_request(f"version must be an integer >= 0, got {version!r}", "version")

        def load_and_swap() -> None:
            try:
                policy = reload(body["policy"])
                gateway.swap_policy(policy, version)
            except (OSError, ValueError) as exc:
                raise bad_request(f"cannot serve {body['policy']!r}: {exc}", "policy") from exc

        await in_thread(load_and_swap)
        return JSONResponse({"policy": body["policy"], "policy_version": gateway.policy_version})

    async def rollout(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        return JSONResponse(gateway.views.rollout(rollout_id, secret=_secret_of(request)))

    async def rollouts(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": gateway.views.rollouts()})

    async def models(request: Request) -> Response:
        model = {"id": gateway.config.model_name, "object": "model", "created": 0}
        return JSONResponse({"object": "list", "data": [{**model, "owned_by": "turnrl"}]})

    async def health(request: Request) -> Response:
        stats = gateway.stats
        return JSONResponse({"status": "ok", **stats})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = f"{exc.detail}: {request.method} {request.url.path}"
        return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code)

    routes = []
    for prefix in PREFIXES:
        routes.append(
            Route(f"{prefix}/v1/chat/completions", _guarded(chat_completions), methods=["POST"])
        )
        routes.append(Route(f"{prefix}/v1/models", _guarded(models), methods=["GET"]))
        if prefix:
            routes.append(Route(f"{prefix}/v1/reward", _guarded(reward), methods=["POST"]))
    routes += [
        Route("/v1/rollouts/{rollout_id}/reward", _guarded(reward), methods=["POST"]),
        Route(AGL_EVENTS, _guarded(event), methods=["POST"]),
        Route("/v1/rollouts/{rollout_id}", _guarded(rollout), methods=["GET"]),
        Route("/health", _guarded(health), methods=["GET"]),
    ]
    if list_rollouts:
        routes.append(Route("/v1/rollouts", _guarded(rollouts), methods=["GET"]))
    if reload is not None:
        routes.append(Route("/admin/reload", _guarded(reload_policy), methods=["POST"]))
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
