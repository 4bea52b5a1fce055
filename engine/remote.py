"""Remote models: an OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp, Parley's own server) behind the Engine API.

HTTP never runs on the engine thread: probing the model list and every turn run on small worker threads
that post their results back through the engine's command queue, so events still come from the engine
thread and session state is only touched there. A RemoteHost is the engine's ModelHost for one endpoint.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator
from urllib.parse import urlsplit

import httpx

from engine import events as ev
from engine.errors import ParleyError
from engine.sampling import SamplingParams, penalised
from engine.session import Session, Turn, TurnRequest

Post = Callable[..., None]  # post(fn, *args): runs fn(*args) on the engine thread
MAX_LINE = 1 << 20  # bytes of one streamed line (a chunk is a few hundred): past it the endpoint is broken
MAX_ERROR_BODY = 64 << 10  # bytes of an error answer read for its message
MAX_MODEL_LIST = 16 << 20  # bytes of a /models answer
FINISH_GRACE_S = 2.0  # after the finish reason, how long the usage and [DONE] may take before the answer ends


class RemoteError(ParleyError):
    """An endpoint that cannot be reached, refuses the request or answers something unreadable."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code  # the endpoint's own error code, passed on (a context overflow stays one)


def api_base(url: str) -> str:
    """'http://host:8000' -> 'http://host:8000/v1'; a URL that already has a path is kept as given."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RemoteError(f"'{url}' is not an http(s) URL of an OpenAI-compatible server.")
    return url if parts.path not in ("", "/") else url + "/v1"


@dataclass(slots=True)
class RemoteModel:
    base_url: str
    model: str | None  # None: the endpoint's only model
    api_key: str | None = None
    timeout: float = 60.0  # connect, and the longest wait between two streamed chunks
    info: dict = field(default_factory=dict)  # filled by probe()
    extensions: bool = True  # False once the endpoint refused a field outside OpenAI's own (OpenAI's API does)

    def __post_init__(self) -> None:
        self.base_url = api_base(self.base_url)

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=authorization(self.api_key), timeout=httpx.Timeout(self.timeout))

    # -- blocking calls (worker threads only)
    def probe(self) -> dict:
        """Checks that the endpoint answers and serves the model; returns ModelLoaded.info."""
        models = [m for m in list_models(self.base_url, self.api_key, self.timeout) if isinstance(m.get("id"), str)]
        ids = [m["id"] for m in models]
        if self.model is None:
            if len(ids) != 1:
                raise RemoteError(f"{self.base_url} serves {len(ids)} models ({_names(ids)}); name the one to use.")
            self.model = ids[0]
        if self.model not in ids:
            raise RemoteError(f"{self.base_url} has no model '{self.model}'; it serves {_names(ids)}.")
        entry = models[ids.index(self.model)]
        context = entry.get("max_model_len") or entry.get("context_length")
        context = context if type(context) is int and context > 0 else None  # not True, not -5
        self.info = {"remote": True, "base_url": self.base_url, "model": self.model, "context": context,
                     "owned_by": entry.get("owned_by")}
        return self.info

    def stream_chat(self, messages: list[dict] | str, params: SamplingParams, cancelled: threading.Event,
                    opened: Callable[[Callable[[], None]], None] | None = None) -> Iterator[tuple]:
        """Yields ('delta', text) then ('done', finish_reason, usage|None); raises RemoteError. `messages` as a string:
        a plain-text document, continued by the endpoint's /completions (no chat template there either). `opened`
        receives a function that ends the connection from any thread (a cancel reaches the endpoint at once)."""
        fields = request_params(params)
        if not self.extensions:
            fields = {k: v for k, v in fields.items() if k not in EXTENSIONS}
        raw = isinstance(messages, str)
        body = {"model": self.model, "prompt" if raw else "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, **fields}
        path = "/completions" if raw else "/chat/completions"
        try:
            with self._client() as client, client.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    body = _json(_read_at_most(response, MAX_ERROR_BODY)[0])
                    if self.extensions and _refused_extension(response.status_code, body, fields):
                        self.extensions = False  # asked again without them, and from now on
                        yield from self.stream_chat(messages, params, cancelled, opened)
                        return
                    raise RemoteError(http_error(self.base_url, response.status_code, body, self.model), _code(body))
                if opened is not None:
                    opened(lambda: _interrupt(response))
                yield from _read_stream(response, cancelled)
        except httpx.HTTPError as exc:
            raise RemoteError(transport_error(self.base_url, exc, self.timeout)) from exc


def authorization(api_key: str | None) -> dict[str, bytes]:
    """The key's header, in UTF-8 as curl sends it and Parley's server reads it: a key with an é failed every request
    ("UnicodeEncodeError('ascii', 'Bearer clé', …)"); the spaces and line end of a pasted key are not part of it."""
    key = (api_key or "").strip()
    return {"Authorization": b"Bearer " + key.encode()} if key else {}


def list_models(base_url: str, api_key: str | None = None, timeout: float = 10.0) -> list[dict]:
    """The endpoint's `/v1/models` entries (blocking: call it off the GUI and engine threads)."""
    base = api_base(base_url)
    try:
        with httpx.stream("GET", base + "/models", headers=authorization(api_key), timeout=timeout) as response:
            content, whole = _read_at_most(response, MAX_MODEL_LIST)
    except httpx.HTTPError as exc:
        raise RemoteError(transport_error(base, exc, timeout)) from exc
    if response.status_code >= 400:
        raise RemoteError(http_error(base, response.status_code, _json(content)))
    if not whole:
        raise RemoteError(f"{base}/models answered more than {MAX_MODEL_LIST >> 20} MB: not an OpenAI model list.")
    try:
        data = _json(content)["data"]
        assert isinstance(data, list) and all(isinstance(m, dict) for m in data)
    except Exception:
        raise RemoteError(f"{base}/models did not answer with an OpenAI model list.") from None
    return data


def request_params(p: SamplingParams) -> dict:
    """SamplingParams as OpenAI fields; top_k, min_p, repetition_penalty, repeat_last_n and the thinking switch go as
    the usual extensions."""
    out = {"temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_tokens}
    if p.stop:
        out["stop"] = list(p.stop)
    if p.seed is not None:
        out["seed"] = p.seed
    if p.top_k:
        out["top_k"] = p.top_k
    if p.min_p:
        out["min_p"] = p.min_p
    if penalised(p):  # a window of 0 turns them off
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(p, name):
                out[name] = getattr(p, name)
        if p.repetition_penalty != 1.0:
            out["repetition_penalty"] = p.repetition_penalty
        if p.repeat_last_n != -1:  # llama.cpp's and Ollama's servers read it; others ignore it
            out["repeat_last_n"] = p.repeat_last_n
    if p.logit_bias:  # OpenAI's own field: the ids are the remote model's, as the caller named them
        out["logit_bias"] = {str(token): value for token, value in p.logit_bias.items()}
    if p.thinking is not None:  # as vLLM, llama.cpp's server and Parley's take the switch
        out["chat_template_kwargs"] = {"enable_thinking": p.thinking}
    return out


# the fields request_params adds beyond OpenAI's own (vLLM, SGLang, llama.cpp, Ollama and Parley read them)
EXTENSIONS = ("top_k", "min_p", "repetition_penalty", "repeat_last_n", "chat_template_kwargs")


def _refused_extension(status: int, body, fields: dict) -> bool:
    """A 400 that names one of the extension fields sent (OpenAI: "Unrecognized request argument supplied: top_k")."""
    err = body.get("error") if isinstance(body, dict) else None
    named = f"{_message(body)} {err.get('param') if isinstance(err, dict) else ''}"
    return status == 400 and any(k in fields and k in named for k in EXTENSIONS)


def _read_stream(response: httpx.Response, cancelled: threading.Event) -> Iterator[tuple]:
    """The answer's pieces from an OpenAI stream. Values of the wrong type are read as absent, and lone surrogates
    become U+FFFD, so nothing an endpoint sends can break the turn's end; an answer that has its finish reason ends
    within FINISH_GRACE_S even where [DONE] never comes."""
    reason, usage, done, grace = None, None, False, None
    tags = _ThoughtTags()
    try:
        for line in _lines(response):
            if cancelled.is_set():
                return  # leaving the `with` closes the connection, which stops the server's generation
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = _chunk(response, data)
            usage = _usage(chunk.get("usage")) or usage
            for choice in chunk.get("choices") if isinstance(chunk.get("choices"), list) else ():
                text = tags.wrap(_reasoning(choice), _text(choice)) if isinstance(choice, dict) else ""
                if text:
                    yield ("delta", text)
                finish = choice.get("finish_reason") if isinstance(choice, dict) else None
                reason = finish if isinstance(finish, str) and finish else reason
            if reason is not None and grace is None:  # the usage chunk and [DONE] may follow; not for ever
                grace = threading.Timer(FINISH_GRACE_S, _interrupt, (response,))
                grace.daemon = True
                grace.start()
    except httpx.HTTPError:
        if reason is None or cancelled.is_set():
            raise
    finally:
        if grace is not None:
            grace.cancel()
    if cancelled.is_set():
        return
    if not done and reason is None:
        raise RemoteError(f"The connection to {response.url} was lost mid-answer.")
    yield ("done", reason, usage)


def _lines(response: httpx.Response) -> Iterator[str]:
    """The stream's lines, none longer than MAX_LINE bytes (a line without end would fill the memory)."""
    pending = b""
    for data in response.iter_bytes():
        pending += data
        if b"\n" in data:  # split only where a line ended: a long line is not scanned again for every piece
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if len(pending) > MAX_LINE:
            raise RemoteError(f"{response.url} sent a line of over {MAX_LINE >> 20} MB: not an OpenAI stream.")
    if pending:
        yield pending.decode("utf-8", "replace")


def _chunk(response: httpx.Response, data: str) -> dict:
    try:
        chunk = json.loads(data)
    except (json.JSONDecodeError, RecursionError):
        chunk = None
    if not isinstance(chunk, dict):
        raise RemoteError(f"{response.url} sent a stream Parley cannot read: {_quoted(data)}")
    if chunk.get("error") is not None:
        raise RemoteError(f"{response.url} failed mid-answer: {_message(chunk) or _quoted(data)}")
    return chunk


def _text(choice: dict) -> str:
    """A choice's new text: the delta's content (a string, or a list of text parts) or a completion's text."""
    delta = choice.get("delta")
    content = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    if isinstance(content, list):
        content = "".join(p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    if not isinstance(content, str):
        return ""
    return content.encode("utf-16", "surrogatepass").decode("utf-16", "replace")  # a lone surrogate: U+FFFD


def _reasoning(choice: dict) -> str:
    """A choice's new thought, where the endpoint sends it apart (`reasoning_content`: DeepSeek's API, llama.cpp's
    server, Parley's; `reasoning`: vLLM's reasoning parsers)."""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ""
    sent = (delta.get("reasoning_content"), delta.get("reasoning"))
    thought = next((t for t in sent if isinstance(t, str) and t), "")
    return thought.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


class _ThoughtTags:
    """A thought sent apart from the reply, as the text of a local model's answer: `<think>…</think>` before it."""

    def __init__(self) -> None:
        self.state = "start"  # start, thought, reply

    def wrap(self, thought: str, text: str) -> str:
        out = ""
        if thought and self.state != "reply":  # a thought after the reply began is not shown, as a local one's
            out, self.state = ("<think>" if self.state == "start" else "") + thought, "thought"
        if text:
            out, self.state = out + ("</think>" if self.state == "thought" else "") + text, "reply"
        return out


def _usage(value) -> dict | None:
    """The usage counts that are whole numbers of tokens; None where none are."""
    if not isinstance(value, dict):
        return None
    counts = {k: value[k] for k in ("prompt_tokens", "completion_tokens")
              if type(value.get(k)) is int and 0 <= value[k] < 1 << 31}
    return counts or None


def _quoted(text: str, n: int = 80) -> str:
    return ascii(text[:n])


def _read_at_most(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """The body's first `limit` bytes, and whether that is all of it (a 300 MB answer is not read into memory)."""
    body = b""
    for data in response.iter_bytes():
        body += data
        if len(body) > limit:
            return body[:limit], False
    return body, True


def _interrupt(response: httpx.Response) -> None:
    """Ends a streamed response's connection from another thread: its blocked read returns at once (closing the
    socket alone would leave it blocked until the read timeout, and the endpoint generating)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def http_error(base: str, status: int, body, model: str | None = None) -> str:
    """One line for an error answer: its status and the endpoint's message (JSON's, or the start of its text)."""
    detail = _message(body) or (body.decode("utf-8", "replace")[:200].strip() if isinstance(body, bytes) else "")
    if status in (401, 403):
        return f"{base} refused the request ({status}): check the API key. {detail}".strip()
    if status == 404 and model is not None:
        return f"{base} answered 404 for model '{model}': {detail}".strip()
    return f"{base} answered {status}: {detail or '(no message)'}".strip()


def transport_error(base: str, exc: httpx.HTTPError, timeout: float) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"{base} did not answer within {timeout:g} s."
    if isinstance(exc, httpx.ConnectError):
        return f"Cannot reach {base}: {exc or 'connection refused'}. Is the server running?"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return f"The connection to {base} was lost mid-answer ({exc})."
    return f"Request to {base} failed: {exc!r}"


def _json(content: bytes):
    """The JSON an answer holds, or its bytes where it is not JSON (quoted by http_error)."""
    try:
        return json.loads(content)
    except (ValueError, RecursionError):
        return content


def _message(body) -> str:
    if not isinstance(body, dict):
        return ""
    err = body.get("error", body.get("detail"))
    if isinstance(err, dict):
        return str(err.get("message", ""))
    return str(err or body.get("message", ""))


def _code(body) -> str | None:
    err = body.get("error") if isinstance(body, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else None


def _names(ids: list) -> str:
    return ", ".join(map(str, ids[:8])) + (" …" if len(ids) > 8 else "") if ids else "none"


@dataclass(eq=False, slots=True)
class _Running:
    turn_id: int
    max_tokens: int = 1 << 31  # the turn's limit: an endpoint that ignores it is cut here (a chunk is >= 1 token)
    cancelled: threading.Event = field(default_factory=threading.Event)
    parts: list[str] = field(default_factory=list)
    chunks: int = 0
    interrupt: Callable[[], None] | None = None  # ends the stream's connection (set by its worker once open)

    def opened(self, interrupt: Callable[[], None]) -> None:
        self.interrupt = interrupt
        if self.cancelled.is_set():  # cancelled while it connected
            interrupt()

    def stop(self) -> None:
        """The worker stops, and the endpoint with it: the connection ends now, not at the next chunk."""
        self.cancelled.set()
        if self.interrupt is not None:
            self.interrupt()


def probe_in_background(remote: RemoteModel, on_ready: Callable[[dict], None], on_error: Callable[[str], None]) -> None:
    """Probes the endpoint on a worker thread; calls on_ready(info) or on_error(message) from that thread."""
    def work() -> None:
        try:
            info = remote.probe()
        except ParleyError as exc:
            on_error(str(exc))
            return
        except Exception as exc:
            on_error(f"Could not use {remote.base_url}: {exc!r}")
            return
        on_ready(info)

    threading.Thread(target=work, name="parley-remote-probe", daemon=True).start()


class RemoteHost:
    """The sessions on one remote model: each turn streams from the endpoint on its own worker thread, whose
    results come back to the engine thread through `post`. A turn that already ended ignores them."""

    def __init__(self, model_id: int, remote: RemoteModel, post: Post, emit: Callable[[ev.Event], None]):
        self.model_id, self.remote = model_id, remote
        self._post, self._emit = post, emit
        self._running: dict[int, tuple[Session, _Running]] = {}  # session id -> the session and its turn

    def info(self) -> dict:
        return dict(self.remote.info)

    # -- engine thread
    def start_turn(self, session: Session, turn_id: int, request: TurnRequest) -> None:
        if request.continue_final:
            raise ParleyError("Continuing an answer needs a local model; regenerate it instead.")
        if request.suffix is not None:
            raise ParleyError("Filling in the middle needs a local model: the markers are its vocabulary's.")
        if request.prompt_ids is not None:
            raise ParleyError("A token-id prompt needs a local model: the ids are its vocabulary's, not the endpoint's.")
        session.begin(request)
        session.turn = Turn(turn_id, stream=None)
        session.last_used = time.monotonic()
        run = _Running(turn_id, request.params.max_tokens)
        self._running[session.session_id] = (session, run)
        messages: list[dict] | str = request.conversation()
        if session.raw:  # a document, continued as it stands (a chat template upstream would answer it instead)
            messages = request.document
        self._emit(ev.Started(session.session_id, turn_id))
        args = (session.session_id, run, messages, request.params)
        threading.Thread(target=self._work, args=args, name="parley-remote-turn", daemon=True).start()

    def cancel(self, session: Session) -> None:
        if session.session_id in self._running:
            self._end_turn(session, "cancelled")

    def close(self, session: Session) -> None:
        if session.session_id in self._running:
            self._end_turn(session, "closed")

    def fork(self, source: Session, child: Session) -> None:
        pass  # the endpoint keeps no state of ours

    def has_work(self) -> bool:
        return False  # turns run on worker threads

    def step(self) -> None:
        pass

    def settle(self) -> None:
        pass

    def shutdown(self) -> None:
        for session, _ in list(self._running.values()):
            self._end_turn(session, "closed")

    def _end_turn(self, session: Session, reason: str, usage: dict | None = None) -> None:
        """Ends the running turn now (cancel, close or the stream's end); its connection is ended with it."""
        _, run = self._running.pop(session.session_id)
        run.stop()
        text = "".join(run.parts)
        stats = self._stats(session, run, usage)
        session.turn = None
        session.last_used = time.monotonic()
        self._emit(ev.Finished(session.session_id, run.turn_id, reason, text, stats))

    def _stats(self, session: Session, run: _Running, usage: dict | None) -> ev.TurnStats:
        turn, now = session.turn, time.perf_counter()
        usage = usage or {}
        prompt = usage.get("prompt_tokens") or 0
        n = usage.get("completion_tokens") or run.chunks  # servers stream about one token per chunk
        first = turn.first_token_at
        rate = (n - 1) / (now - first) if first is not None and n > 1 and now > first else None
        limit = self.remote.info.get("context") or 0
        return ev.TurnStats(prompt_tokens=prompt, prefilled_tokens=prompt, completion_tokens=n,
                            ttft_s=None if first is None else first - turn.submitted_at, tokens_per_s=rate,
                            context_used=prompt + n, context_limit=limit)

    # -- the worker thread of one turn
    def _work(self, sid: int, run: _Running, messages: list[dict] | str, params: SamplingParams) -> None:
        try:
            for item in self.remote.stream_chat(messages, params, run.cancelled, run.opened):
                self._post(self._on_item, sid, run, item)
        except ParleyError as exc:
            self._post(self._on_error, sid, run, str(exc), exc.code)
        except Exception as exc:
            self._post(self._on_error, sid, run, f"Remote generation failed: {exc!r}")

    # -- worker results, back on the engine thread
    def _current(self, sid: int, run: _Running) -> Session | None:
        session, current = self._running.get(sid, (None, None))
        return session if current is run else None

    def _on_item(self, sid: int, run: _Running, item: tuple) -> None:
        session = self._current(sid, run)
        if session is None:
            return
        if item[0] == "delta":
            if session.turn.first_token_at is None:
                session.turn.first_token_at = time.perf_counter()
            run.parts.append(item[1])
            run.chunks += 1
            self._emit(ev.TokenDelta(sid, run.turn_id, [], item[1]))
            if run.chunks > run.max_tokens:  # more chunks than tokens asked for: it ignored max_tokens
                self._end_turn(session, "length")
        else:
            _, reason, usage = item
            self._end_turn(session, {"stop": "stop", "length": "length"}.get(reason, reason), usage)

    def _on_error(self, sid: int, run: _Running, message: str, code: str | None = None) -> None:
        session = self._current(sid, run)
        if session is None:
            return
        del self._running[sid]
        session.turn = None
        self._emit(ev.Error(sid, run.turn_id, message, code))
