"""The OpenAI-compatible HTTP API: /v1/models, /v1/chat/completions, /v1/completions (streaming or not).

Every request gets its own engine session per choice (`n` for each of a completion's prompts; conversation set from
the request), submits one turn each, relays their events and closes the sessions; concurrent requests and a request's
choices share the engine's batched steps.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time
from dataclasses import dataclass
from functools import partial
from ipaddress import ip_address
from typing import AsyncIterator
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine import events as ev
from engine.logit_bias import check_bias_ids
from engine.tokenizer import Tokenizer
from server import protocol as api
from server.bridge import ServerBridge, ServedModel
from server.call_limit import CallLimit, call_limits
from server.choices import Choices
from server.logprobs import StreamedLogprobs
from server.paced_stream import PacedStream
from server.prompt_logprobs import SharedEcho, joined, prompt_alone, scored_echo, shared
from server.tools import StreamedCalls

DISCONNECT_POLL_S = 0.5
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
LOOPBACK_NAMES = ("localhost", "localhost.")
CLIENT_ERROR_CODES = frozenset({"context_length_exceeded"})  # a turn's error codes that blame the request: 400
BUSY_ERROR_CODES = frozenset({"insufficient_memory"})  # the machine cannot now, another time it may: 503


@dataclass(slots=True)
class ServerSettings:
    """What the HTTP layer accepts: body size and the names it answers to (DNS rebinding defence)."""

    bound_host: str = "127.0.0.1"  # the address listened on; Host headers must name it
    max_body_bytes: int = 8 << 20  # a chat request is kilobytes; tens of MB only tie up the tokenizer
    send_timeout_s: float = 60.0  # a stream whose client takes nothing this long is dropped (nginx's send_timeout)
    allowed_hosts: tuple[str, ...] = ()  # extra names for Host (e.g. a reverse proxy's)
    cors_origins: tuple[str, ...] = ()  # web page origins whose scripts may call the API ("*": any); none by default

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, not {self.max_body_bytes}")
        if not self.send_timeout_s > 0:
            raise ValueError(f"send_timeout_s must be more than 0, not {self.send_timeout_s}")
        for origin in self.cors_origins:
            parts = urlsplit(origin)
            if origin != "*" and not (parts.scheme and parts.netloc and not parts.path.strip("/")):
                raise ValueError(f"a CORS origin is a scheme and a host (http://localhost:3000) or *, not {origin!r}")
        # as requests' Host and Origin are read (lower case, Host without its port): 'MyProxy.lan' or 'proxy:8080'
        # given as they were never matched, and every request through them was refused (421, 403)
        self.cors_origins = tuple(o.rstrip("/").lower() for o in self.cors_origins)
        self.allowed_hosts = tuple(_hostname(h.strip()) for h in self.allowed_hosts)
        if "" in self.allowed_hosts:
            raise ValueError("an allowed host is a name such as proxy.example.com, not ''")

    def cors_allows(self, origin: str) -> bool:
        return "*" in self.cors_origins or origin.rstrip("/").lower() in self.cors_origins


def build_app(bridge: ServerBridge, api_key: str | None = None, settings: ServerSettings | None = None) -> Starlette:
    settings = settings or ServerSettings()

    def guarded(handler):
        async def endpoint(request: Request) -> Response:
            try:
                _check_origin(request, settings)
                _authorize(request, api_key)
                request.state.max_body, request.state.send_timeout = settings.max_body_bytes, settings.send_timeout_s
                return await handler(request, bridge)
            except api.APIError as exc:
                return _error(exc)
        return endpoint

    routes = [
        Route("/v1/models", guarded(list_models), methods=["GET"]),
        Route("/v1/models/{model:path}", guarded(get_model), methods=["GET"]),
        *_with_slash("/v1/chat/completions", guarded(chat_completions), methods=["POST"]),
        *_with_slash("/v1/completions", guarded(completions), methods=["POST"]),
        *_with_slash("/health", lambda request: health(request, bridge), methods=["GET"]),
    ]
    handlers = {HTTPException: _http_error, Exception: _internal_error}
    middleware = [Middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                             allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type"])] \
        if settings.cors_origins else []  # answers preflights and marks answers readable by those pages
    app = Starlette(routes=routes, exception_handlers=handlers, middleware=middleware)
    app.state.stopping = False  # set by server/run.py as the server shuts down: turns in flight end with a 503
    return app


def _with_slash(path: str, endpoint, methods: list[str]) -> list[Route]:
    """The path, and the path with a trailing slash: Starlette's 307 to the other spelling left `curl -X POST` (no
    -L) with an empty body, and clients that do follow it send the body twice."""
    return [Route(path, endpoint, methods=methods), Route(path + "/", endpoint, methods=methods)]


# -- endpoints
def health(request: Request, bridge: ServerBridge) -> Response:
    """Whether the server takes requests, and how busy it is (a load balancer's choice): open without a key, so it
    counts models rather than naming them; a server shutting down answers 503."""
    stopping = request.app.state.stopping
    body = {"status": "stopping" if stopping else "ok", **bridge.busy(), "models": len(bridge.models)}
    return JSONResponse(body, status_code=503 if stopping else 200)


async def list_models(request: Request, bridge: ServerBridge) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(m) for m in bridge.models]})


async def get_model(request: Request, bridge: ServerBridge) -> Response:
    if not request.path_params["model"]:  # "/v1/models/": the list
        return await list_models(request, bridge)
    return JSONResponse(_model_card(_model(bridge, request.path_params["model"])))


async def chat_completions(request: Request, bridge: ServerBridge) -> Response:
    data = api.parse_json(await _read_body(request))
    model = _model(bridge, data.get("model"))
    req = api.parse_chat(data, model.context, model.info.get("tool_calls"), model.id)
    return await _serve_turn(request, bridge, model, req, api.new_id("chatcmpl"))


async def completions(request: Request, bridge: ServerBridge) -> Response:
    data = api.parse_json(await _read_body(request))
    model = _model(bridge, data.get("model"))
    req = api.parse_completion(data, model.context)
    return await _serve_turn(request, bridge, model, req, api.new_id("cmpl"))


# -- one turn
async def _serve_turn(request: Request, bridge: ServerBridge, model: ServedModel, req: api.TurnRequest, rid: str) -> Response:
    if req.params.logprobs is not None and model.info.get("remote"):  # its server answers with text alone here
        raise api.APIError(400, f"Log-probabilities are not available from {model.id}, a remote model.", "logprobs")
    vocab = None if model.info.get("remote") else model.info.get("vocab")
    wrong_ids = check_bias_ids(req.params.logit_bias, vocab) if vocab else None
    if wrong_ids:  # the engine would refuse the turn with the same line: said before a session opens
        raise api.APIError(400, wrong_ids, "logit_bias")
    if req.params.grammar is not None and model.info.get("remote"):  # the grammar masks a local model's tokens
        raise api.APIError(400, f"'response_format' is not available from {model.id}, a remote model.",
                           "response_format")
    if req.tools is not None and model.info.get("remote"):  # its calls would come back in its server's own form
        raise api.APIError(400, f"'tools' are not available from {model.id}, a remote model.", "tools")
    if req.suffix:
        _check_fill_in_middle(model)
    client = _Client(request)
    turn = await _begin(client, bridge, model, req)
    if req.stream:
        body = _sse(client, turn, model.id, req, rid, model.tokenizer)
        return PacedStream(body, request.state.send_timeout, headers={"Cache-Control": "no-cache"})
    logprobs = [[] for _ in range(turn.n)] if req.params.logprobs is not None or req.ranked else None
    limits = call_limits(req.tools, turn.n, req.prompt if req.continue_final else "")
    scored = [None] * turn.n if req.params.prompt_logprobs is not None else None  # each choice's prompt entries
    try:
        ends = await _wait_ends(client, turn, logprobs, limits, scored)
    finally:
        turn.close()
    if isinstance(ends[0], ev.Error):
        raise _turn_error(ends[0], req, prompt=turn.index(ends[0].session_id) // req.made)
    if req.prompt_only:
        ends, logprobs = prompt_alone(ends, logprobs)
    if scored:
        scored = shared(scored, req.made)
    answers = [(_new_text(e.text, req), "tool_calls" if limits and limits[i].full else e.reason)
               for i, e in enumerate(ends)]
    stats = [e.stats for e in ends]
    echoes = _echoes(req, len(ends), model.tokenizer)
    if req.ranked:  # each prompt's n answers with the highest mean log-probability a token, best first
        best = _best(_ranked_entries(logprobs, ends, req, model.tokenizer), req.made, req.n)
        answers, echoes = [answers[k] for k in best], echoes and [echoes[k] for k in best]
        logprobs = [logprobs[k] for k in best] if req.params.logprobs is not None else None
        scored = scored and [scored[k] for k in best]
    if scored:
        logprobs = joined(scored, logprobs)
    if req.raw:
        unwritten = _unwritten(req, len(answers), model.tokenizer) if scored else None
        return JSONResponse(api.completion_response(rid, model.id, answers, stats, req.created, logprobs, echoes,
                                                    req.prompt_count, unwritten))
    prefix = req.prompt if req.continue_final else ""
    return JSONResponse(api.chat_response(rid, model.id, answers, stats, req.created, prefix, logprobs, req.tools))


def _check_fill_in_middle(model: ServedModel) -> None:
    if not model.info.get("fill_in_middle"):
        where = "a remote model" if model.info.get("remote") else "its vocabulary holds no fill-in-the-middle tokens"
        raise api.APIError(400, f"'suffix' needs a model trained to fill in the middle; {model.id}: {where}.", "suffix")


def _best(logprobs: list[list], made: int, n: int) -> list[int]:
    """The answers sent where `made` answers a prompt were made: each prompt's `n` with the highest mean log-probability
    a token, best first, prompt by prompt."""
    groups = [range(start, start + made) for start in range(0, len(logprobs), made)]
    return [k for group in groups for k in sorted(group, key=lambda k: -_mean_logprob(logprobs[k]))[:n]]


def _ranked_entries(logprobs: list[list], ends: list[ev.Finished], req: api.TurnRequest,
                    tokenizer: Tokenizer | None) -> list[list]:
    """Each answer's entries as best_of ranks them: without the end-of-turn token's that a scored echo lists
    (engine/local_host.py `_logprobs`), so an answer ranks with echo as it does without."""
    if not req.params.echo or tokenizer is None:
        return logprobs
    ends_as = {tokenizer.decode([i]) for i in tokenizer.stop_ids}  # as the entries name them (engine/logprobs.py)
    return [entries[:-1] if end.reason == "stop" and entries and entries[-1].token in ends_as else entries
            for entries, end in zip(logprobs, ends)]


def _mean_logprob(entries: list) -> float:
    return sum(e.logprob for e in entries) / len(entries) if entries else float("-inf")


def _echoes(req: api.TurnRequest, answers: int, tokenizer: Tokenizer | None) -> list[str] | None:
    """What `echo` puts before each of `answers` (prompt by prompt, `made` each): its prompt's text, or its token ids
    decoded as vLLM decodes them (special tokens written out: a BOS the client sent shows); None without echo."""
    if not req.echo:
        return None
    texts = [_prompt_text(req, p, tokenizer) for p in range(req.prompt_count)]
    return [texts[k // req.made] for k in range(answers)]


def _unwritten(req: api.TurnRequest, answers: int, tokenizer: Tokenizer | None) -> list[int]:
    """Each of `answers` sent's leading prompt entries (`n` a prompt) that its echo does not write: the BOS the engine
    puts before a text prompt (an id prompt's echo writes its BOS out), so text offsets count in the prompt sent."""
    bos = int(tokenizer is not None and tokenizer.bos_id is not None)
    return [0 if req.prompt_ids(k // req.n) is not None else bos for k in range(answers)]


def _prompt_text(req: api.TurnRequest, p: int, tokenizer: Tokenizer | None) -> str:
    ids = req.prompt_ids(p)
    if ids is None:
        return req.prompts[p]
    return tokenizer.decode(ids) if tokenizer is not None else ""  # a remote model takes no token ids


def _new_text(text: str, req: api.TurnRequest) -> str:
    """A continued answer's Finished holds all of it; the client sent the part before and gets what came after (the
    part without its trailing whitespace where the chat template trimmed it: the new text starts from there)."""
    if req.continue_final:
        for sent in (req.prompt, req.prompt.rstrip()):
            if text.startswith(sent):
                return text[len(sent):]
    return text


async def _begin(client: "_Client", bridge: ServerBridge, model: ServedModel, req: api.TurnRequest) -> Choices:
    """Opens a session per choice and submits each prompt's first (the rest as the model's slots allow: `Choices`); a
    request the engine refuses (e.g. longer than the context) is a 400 before any answer begins. A client that leaves
    while its prompt is tokenised or queued cancels it (`close`)."""
    turn = Choices(bridge, bridge.slots(model))
    try:
        sids = [turn.open(model, req.raw) for _ in range(req.prompt_count * req.made)]  # prompt by prompt, n each
        for first in (True, False):  # a prompt's answers differ by their seeds alone: its first gets the verdict
            for k, sid in enumerate(sids):
                p, i = divmod(k, req.made)
                if (i == 0) == first:
                    turn.submit(sid, partial(_submit, bridge, sid, req, p, i, sids[0]), now=first)
        started: set[int] = set()
        while len(started) < turn.submitted:
            e = await _poll(client, turn.queue)
            if e is None:
                raise _left_early(client)
            if isinstance(e, ev.Started):
                started.add(e.session_id)
            elif isinstance(e, ev.Error) and e.session_id not in started:
                raise _turn_error(e, req, refused=True, prompt=turn.index(e.session_id) // req.made)
            else:
                turn.held.append(e)  # a choice that started first may already be answering
        return turn
    except BaseException:
        turn.close()
        raise


def _submit(bridge: ServerBridge, sid: int, req: api.TurnRequest, p: int, i: int, group: int) -> None:
    """Prompt `p`'s answer `i`, on session `sid`; the request's answers are one `group` (its first session's id): they
    wait for a slot in turn with other requests' answers, not all ahead of them."""
    bridge.engine.submit(sid, req.messages(p), req.choice_params(i), req.system, continue_final=req.continue_final,
                         tools=list(req.tools.tools) if req.tools else None, suffix=req.suffix or None,
                         prompt_ids=req.prompt_ids(p), group=group)


def _turn_error(e: ev.Error, req: api.TurnRequest, refused: bool = False, prompt: int = 0) -> api.APIError:
    """A request refused before it started, or one whose error says the request is at fault (a remote model refuses
    only after Started), is the client's to fix: 400; one the machine's free memory cannot hold now: 503. Anything else
    failed on this side: 500. `prompt`: the refused one, named where the request sent several."""
    if e.code in BUSY_ERROR_CODES:  # not the server broken (500), nor the request wrong for every server (400)
        return api.APIError(503, e.message, kind="server_error", code=e.code)
    if (refused or e.code in CLIENT_ERROR_CODES) and req.prompt_count > 1:
        return api.APIError(400, f"prompt[{prompt}]: {e.message}", f"prompt[{prompt}]", e.code)
    if refused or e.code in CLIENT_ERROR_CODES:
        return api.APIError(400, e.message, "prompt" if req.raw else "messages", e.code)
    return api.APIError(500, e.message, kind="server_error", code=e.code)


async def _wait_ends(client: "_Client", turn: Choices, logprobs: list[list] | None = None,
                     limits: list[CallLimit] | None = None, scored: list | None = None) -> list[ev.Event]:
    """Every choice's Finished, in choice order, or the first Error alone (one failed choice fails the request); stops
    waiting (the caller cancels the turns) if the client goes away. `logprobs`: each choice's entries are added;
    `limits`: a choice that begins a call past its one is stopped there; `scored`: each choice's prompt entries are
    put."""
    ends: dict[int, ev.Event] = {}
    while len(ends) < turn.n:
        e = await _next_event(client, turn)
        if e is None:
            raise _left_early(client)
        if isinstance(e, ev.Error):
            return [e]
        if isinstance(e, ev.TokenDelta) and logprobs is not None and e.logprobs:
            logprobs[turn.index(e.session_id)] += e.logprobs
        if isinstance(e, ev.TokenDelta) and scored is not None and e.prompt_logprobs is not None:
            scored[turn.index(e.session_id)] = e.prompt_logprobs
        if isinstance(e, ev.TokenDelta) and limits is not None and limits[turn.index(e.session_id)].reached(e.text):
            turn.stop(turn.index(e.session_id))
        if isinstance(e, ev.Finished):
            ends[turn.index(e.session_id)] = e
            turn.ended()
    return [ends[i] for i in range(turn.n)]


async def _sse(client: "_Client", turn: Choices, model: str, req: api.TurnRequest, rid: str,
               tokenizer: Tokenizer | None = None) -> AsyncIterator[str]:
    """The choices as server-sent events, each chunk naming its choice (prompt by prompt: p * n + i); leaving early
    (client gone: Starlette cancels us) cancels every turn. `tokenizer`: an echoed token-id prompt's text."""
    # a thought goes as reasoning_content
    splits = [api.ReasoningSplit(req.prompt if req.continue_final else "") for _ in range(turn.n)]
    calls = [StreamedCalls(req.tools, lambda: api.new_id("call")) if req.tools is not None else None
             for _ in range(turn.n)]  # content read for calls
    logprobs = [StreamedLogprobs(req.raw) for _ in range(turn.n)]  # empty where the request asks for none
    scored = SharedEcho(req.made) if req.params.prompt_logprobs is not None else None
    ends: dict[int, ev.Finished] = {}
    try:
        echoes, unwritten = _echoes(req, turn.n, tokenizer), _unwritten(req, turn.n, tokenizer)
        for i in range(turn.n):  # a chat answer's role first; an echoed completion's prompt
            if not req.raw:
                yield _event(api.chat_chunk(rid, model, req, {"role": "assistant", "content": ""}, index=i))
            elif echoes and echoes[i] and req.params.prompt_logprobs is None:  # a scored one waits for its entries
                yield _event(api.completion_chunk(rid, model, req, echoes[i], index=i))
        while len(ends) < turn.n:
            e = await _next_event(client, turn)
            if e is None and not client.stopping:
                return  # the client went away: `finally` cancels the turns
            if e is None:  # the server is stopping: the client still reads, and learns why its answer ends here
                yield _event(_left_early(client).body())
                break
            if isinstance(e, ev.Error):
                yield _event(_turn_error(e, req, prompt=turn.index(e.session_id) // req.made).body())
                break
            i = turn.index(e.session_id)
            if scored is not None and scored.waits(i, e):
                continue
            if scored is not None and (entries := scored.echo(i, turn.held)) is not None:  # the echo, with them
                chunk = api.completion_chunk(rid, model, req, echoes[i], index=i)
                yield _event(scored_echo(chunk, entries, logprobs[i], unwritten[i]))
            if isinstance(e, ev.TokenDelta):
                if req.prompt_only:
                    continue  # the one token made is no answer
                logprobs[i].held += e.logprobs or []
                full = calls[i] is not None and calls[i].full
                for chunk in _delta_chunks(rid, model, req, splits[i], e.text, i, calls[i]):
                    yield _event(logprobs[i].attach(chunk))
                if not full and calls[i] is not None and calls[i].full:  # a call past its one: the answer ends
                    turn.stop(i)
                continue
            ends[i] = prompt_alone([e], None)[0][0] if req.prompt_only else e
            turn.ended()
            reason = ends[i].reason
            if not req.raw:
                for delta in _tail_deltas(splits[i], calls[i]):
                    yield _event(logprobs[i].attach(api.chat_chunk(rid, model, req, delta, index=i)))
                if calls[i] is not None and calls[i].called and (reason in api.ENDED or calls[i].full):
                    reason = "tool_calls"
            yield _event(logprobs[i].attach(api.completion_chunk(rid, model, req, "", reason, index=i) if req.raw
                                            else api.chat_chunk(rid, model, req, {}, reason, index=i)))
        else:
            if req.include_usage:
                build = api.completion_chunk if req.raw else api.chat_chunk
                yield _event(build(rid, model, req, "" if req.raw else {}, stats=[ends[i].stats for i in range(turn.n)]))
        yield "data: [DONE]\n\n"
    finally:
        turn.close()


def _delta_chunks(rid: str, model: str, req: api.TurnRequest, split: api.ReasoningSplit, text: str,
                  index: int, calls: StreamedCalls | None = None) -> list[dict]:
    """Choice `index`'s chunks for new text: the raw text, or the chat deltas (none while a tag may be opening, or
    while `calls` holds what may be a tool call's start)."""
    if not text:
        return []
    if req.raw:
        return [api.completion_chunk(rid, model, req, text, index=index)]
    return [api.chat_chunk(rid, model, req, delta, index=index) for delta in _chat_deltas(split.feed(text), calls)]


def _chat_deltas(delta: dict, calls: StreamedCalls | None, final: bool = False) -> list[dict]:
    """A reasoning split's delta as chat deltas: its thought, then its content read for tool calls by `calls`."""
    if calls is None:
        return [delta] if delta else []
    thought = [{"reasoning_content": delta["reasoning_content"]}] if delta.get("reasoning_content") else []
    content = calls.feed(delta["content"]) if delta.get("content") else []
    return thought + content + (calls.finish() if final else [])


def _tail_deltas(split: api.ReasoningSplit, calls: StreamedCalls | None) -> list[dict]:
    """An answer's last deltas once it ends: what the reasoning split held, then what the call stream held (its
    content, and the rest of any call under way)."""
    return _chat_deltas(split.finish(), calls, final=True)


async def _next_event(client: "_Client", turn: Choices) -> ev.Event | None:
    """A choice's next TokenDelta, Finished or Error (held ones first); None once the client has disconnected."""
    while True:
        e = turn.held.popleft() if turn.held else await _poll(client, turn.queue)
        if e is None or isinstance(e, (ev.TokenDelta, ev.Finished)) or isinstance(e, ev.Error) and e.turn_id is not None:
            return e


def _left_early(client: "_Client") -> api.APIError:
    """Why a turn stopped before its end: the server stopping (503: try again later) or the client gone."""
    if client.stopping:
        return api.APIError(503, "The server is shutting down; send the request again once it is back.",
                            kind="server_error", code="server_shutting_down")
    return api.APIError(499, "The client closed the connection.")


async def _poll(client: "_Client", queue: asyncio.Queue) -> ev.Event | None:
    """The session's next event, or None once the client has gone or the server is stopping; the client is checked
    even while events flow, else a non-streaming answer whose tokens keep coming would run to max_tokens for nobody."""
    while True:
        try:
            e = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            e = None
        if client.stopping or await client.gone():
            return None
        if e is not None:
            return e


class _Client:
    """The HTTP client of one request, asked whether it is still there at most every DISCONNECT_POLL_S."""

    def __init__(self, request: Request):
        self.request, self.checked = request, time.monotonic()

    @property
    def stopping(self) -> bool:
        """The server is shutting down (server/run.py): no answer in flight may outlast it."""
        return self.request.app.state.stopping

    async def gone(self) -> bool:
        now = time.monotonic()
        if now - self.checked < DISCONNECT_POLL_S:
            return False
        self.checked = now
        return await self.request.is_disconnected()


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


# -- helpers
async def _read_body(request: Request) -> bytes:
    """The body, refused (413) as soon as it passes the limit: a 100 MB message is never buffered or tokenised."""
    limit = request.state.max_body
    refused = api.APIError(413, f"The request body is larger than this server accepts ({limit:,} bytes).",
                           code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise refused
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        # a browser may POST text/plain cross-site without asking first; JSON needs a preflight (--cors-origin only)
        raise api.APIError(415, "Send the request body as 'Content-Type: application/json'.")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise refused
        chunks.append(chunk)
    return b"".join(chunks)


def _check_origin(request: Request, settings: ServerSettings) -> None:
    """Host must name the bound address (a rebound DNS name must not reach a loopback server); a browser's
    Origin, when sent, must too."""
    host = request.headers.get("host", "")
    if not _allowed_host(_hostname(host), settings):
        raise api.APIError(421, f"This server does not answer to the host {host!r}.", code="host_not_allowed")
    origin = request.headers.get("origin")
    if origin is not None and settings.cors_allows(origin):
        return
    if origin is not None and origin != "null" and not _allowed_host(urlsplit(origin).hostname or "", settings):
        raise api.APIError(403, f"Requests from web pages of {origin!r} are not allowed.", code="origin_not_allowed")
    if origin == "null":
        raise api.APIError(403, "Requests from sandboxed web pages are not allowed.", code="origin_not_allowed")


def _hostname(host: str) -> str:
    """'[::1]:8000' -> '::1', 'Example.COM:80' -> 'example.com'."""
    if host.startswith("["):
        return host[1:].partition("]")[0].lower()
    return host.rpartition(":")[0].lower() if host.count(":") == 1 else host.lower()


def _allowed_host(name: str, settings: ServerSettings) -> bool:
    bound = settings.bound_host.lower()
    if name in settings.allowed_hosts or name == bound.strip("[]"):
        return True
    if bound in WILDCARD_HOSTS:
        return bool(name)  # listening everywhere: any name may reach it (and --api-key is the guard)
    return _loopback(bound) and (name in LOOPBACK_NAMES or _loopback(name))


def _loopback(host: str) -> bool:
    try:
        return host in LOOPBACK_NAMES or ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _authorize(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    # headers arrive as latin-1 text: their raw bytes are what a UTF-8 client sent for a non-ASCII key
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("latin-1"), api_key.encode()):
        raise api.APIError(401, "Missing or wrong API key: send 'Authorization: Bearer <key>'.",
                           code="invalid_api_key", kind="authentication_error")


def _model(bridge: ServerBridge, name) -> ServedModel:
    """The request's model; a request without one gets the server's only model, as llama.cpp's server does."""
    served = ", ".join(m.id for m in bridge.models) or "none"
    if name is None and len(bridge.models) == 1:
        return bridge.models[0]
    if name is None:
        raise api.APIError(400, f"'model' is required: this server has {served}.", "model")
    if not isinstance(name, str) or not name:
        raise api.APIError(400, f"'model' must be the id of a served model: {served}.", "model")
    found = bridge.find(name)
    if found is None:
        raise api.APIError(404, f"The model '{name}' does not exist here; this server has: {served}.", "model",
                           "model_not_found")
    return found


def _model_card(m: ServedModel) -> dict:
    return {"id": m.id, "object": "model", "created": m.created, "owned_by": "parley", "max_model_len": m.context}


def _error(exc: api.APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    response = _error(api.APIError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}."))
    response.headers.update(exc.headers or {})  # a 405's Allow
    return response


async def _internal_error(request: Request, exc: Exception) -> Response:
    return _error(api.APIError(500, f"Internal server error: {exc!r}", kind="server_error"))
