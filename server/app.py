"""The OpenAI-compatible HTTP API: /v1/models, /v1/chat/completions, /v1/completions (streaming or not).

Every request gets its own engine session (conversation set from the request), submits one turn, relays
its events and closes the session; concurrent requests share the engine's batched steps.
"""
from __future__ import annotations

import asyncio
import hmac
import json
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine import events as ev
from server import protocol as api
from server.bridge import ServerBridge, ServedModel

DISCONNECT_POLL_S = 0.5


def build_app(bridge: ServerBridge, api_key: str | None = None) -> Starlette:
    def guarded(handler):
        async def endpoint(request: Request) -> Response:
            try:
                _authorize(request, api_key)
                return await handler(request, bridge)
            except api.APIError as exc:
                return _error(exc)
        return endpoint

    routes = [
        Route("/v1/models", guarded(list_models), methods=["GET"]),
        Route("/v1/models/{model:path}", guarded(get_model), methods=["GET"]),
        Route("/v1/chat/completions", guarded(chat_completions), methods=["POST"]),
        Route("/v1/completions", guarded(completions), methods=["POST"]),
        Route("/health", lambda _request: JSONResponse({"status": "ok"}), methods=["GET"]),
    ]
    handlers = {HTTPException: _http_error, Exception: _internal_error}
    return Starlette(routes=routes, exception_handlers=handlers)


# -- endpoints
async def list_models(request: Request, bridge: ServerBridge) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(m) for m in bridge.models]})


async def get_model(request: Request, bridge: ServerBridge) -> Response:
    return JSONResponse(_model_card(_model(bridge, request.path_params["model"])))


async def chat_completions(request: Request, bridge: ServerBridge) -> Response:
    data = api.parse_json(await request.body())
    model = _model(bridge, data.get("model"))
    req = api.parse_chat(data, model.context)
    return await _serve_turn(request, bridge, model, req, api.new_id("chatcmpl"))


async def completions(request: Request, bridge: ServerBridge) -> Response:
    data = api.parse_json(await request.body())
    model = _model(bridge, data.get("model"))
    req = api.parse_completion(data, model.context)
    return await _serve_turn(request, bridge, model, req, api.new_id("cmpl"))


# -- one turn
async def _serve_turn(request: Request, bridge: ServerBridge, model: ServedModel, req: api.TurnRequest, rid: str) -> Response:
    sid, queue = await _begin(bridge, model, req)
    if req.stream:
        body = _sse(request, bridge, sid, queue, model.id, req, rid)
        return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        end = await _wait_end(request, queue)
    finally:
        bridge.close(sid)
    if isinstance(end, ev.Error):
        raise api.APIError(500, end.message, kind="server_error")
    build = api.completion_response if req.raw else api.chat_response
    return JSONResponse(build(rid, model.id, end.text, end.reason, end.stats))


async def _begin(bridge: ServerBridge, model: ServedModel, req: api.TurnRequest) -> tuple[int, asyncio.Queue]:
    """Opens the session and submits; a request the engine refuses (e.g. longer than the context) is a 400."""
    sid, queue = bridge.open(model, req.raw)
    try:
        messages = req.history + [{"role": "user", "content": req.prompt}]
        bridge.engine.submit(sid, messages, req.params, req.system)
        while True:
            e = await queue.get()
            if isinstance(e, ev.Started):
                return sid, queue
            if isinstance(e, ev.Error):
                code = "context_length_exceeded" if "context" in e.message else None
                raise api.APIError(400, e.message, "messages" if not req.raw else "prompt", code)
    except BaseException:
        bridge.close(sid)
        raise


async def _wait_end(request: Request, queue: asyncio.Queue) -> ev.Event:
    """The turn's Finished or Error; stops waiting (the caller cancels the turn) if the client goes away."""
    while True:
        e = await _next_event(request, queue)
        if e is None:
            raise api.APIError(499, "The client closed the connection.")
        if not isinstance(e, ev.TokenDelta):
            return e


async def _sse(request: Request, bridge: ServerBridge, sid: int, queue: asyncio.Queue, model: str,
               req: api.TurnRequest, rid: str) -> AsyncIterator[str]:
    """The turn as server-sent events; leaving early (client gone: Starlette cancels us) cancels the turn."""
    try:
        if not req.raw:
            yield _event(api.chat_chunk(rid, model, {"role": "assistant", "content": ""}))
        while True:
            e = await _next_event(request, queue)
            if e is None:
                return  # the client went away: `finally` cancels the turn
            if isinstance(e, ev.TokenDelta):
                if e.text:
                    yield _event(api.completion_chunk(rid, model, e.text) if req.raw
                                 else api.chat_chunk(rid, model, {"content": e.text}))
                continue
            if isinstance(e, ev.Error):
                yield _event(api.APIError(500, e.message, kind="server_error").body())
                break
            yield _event(api.completion_chunk(rid, model, "", e.reason) if req.raw
                         else api.chat_chunk(rid, model, {}, e.reason))
            if req.include_usage:
                build = api.completion_chunk if req.raw else api.chat_chunk
                yield _event(build(rid, model, "" if req.raw else {}, stats=e.stats))
            break
        yield "data: [DONE]\n\n"
    finally:
        bridge.close(sid)


async def _next_event(request: Request, queue: asyncio.Queue) -> ev.Event | None:
    """The turn's next TokenDelta, Finished or Error; None once the client has disconnected."""
    while True:
        try:
            e = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                return None
            continue
        if isinstance(e, (ev.TokenDelta, ev.Finished)) or isinstance(e, ev.Error) and e.turn_id is not None:
            return e


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


# -- helpers
def _authorize(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise api.APIError(401, "Missing or wrong API key: send 'Authorization: Bearer <key>'.",
                           code="invalid_api_key", kind="authentication_error")


def _model(bridge: ServerBridge, name) -> ServedModel:
    if not isinstance(name, str):
        raise api.APIError(400, "'model' must be the id of a served model (see GET /v1/models).", "model")
    found = bridge.find(name)
    if found is None:
        served = ", ".join(m.id for m in bridge.models) or "none"
        raise api.APIError(404, f"The model '{name}' does not exist here; this server has: {served}.", "model",
                           "model_not_found")
    return found


def _model_card(m: ServedModel) -> dict:
    return {"id": m.id, "object": "model", "created": m.created, "owned_by": "parley", "max_model_len": m.context}


def _error(exc: api.APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return _error(api.APIError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}."))


async def _internal_error(request: Request, exc: Exception) -> Response:
    return _error(api.APIError(500, f"Internal server error: {exc!r}", kind="server_error"))
