"""A tiny misbehaving OpenAI-compatible server for the remote backend's error paths.

mode "stall": lists its model, then never answers a chat request; "drop": sends one chunk and hangs up;
"slow-models": never answers /v1/models; "typed": an answer whose fields have the wrong types (content as a list of
parts, usage counts as text, a finish reason in a list) and a lone surrogate; "no-done": a whole answer, then the
connection held open without [DONE]; "hold": one chunk, then nothing (`closed` is set when Parley hangs up);
"long-line": a line of 3 MB without end; "big-models": a model list of 40 MB; "forever": chunks without end (it
ignores max_tokens).
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "stalling-model"


def _typed(handler, outer) -> None:
    handler._send({"choices": [{"delta": {"content": [{"type": "text", "text": "Hi"}, 5]}, "finish_reason": None}]})
    handler._send('{"choices": [{"delta": {"content": "\\ud800 there"}, "finish_reason": ["stop"]}]}')
    handler._send({"choices": [{"delta": {"content": 5}, "finish_reason": "stop"}], "usage": {"prompt_tokens": "7",
                                                                                           "completion_tokens": 2}})
    handler._send("[DONE]")


def _no_done(handler, outer) -> None:
    handler._send({"choices": [{"delta": {"content": "Hi"}, "finish_reason": "stop"}]})
    outer.release.wait(30)


def _hold(handler, outer) -> None:
    handler._send({"choices": [{"delta": {"content": "Hel"}, "finish_reason": None}]})
    try:  # a read that returns means Parley hung up
        handler.rfile.read(1)
    except OSError:
        pass
    outer.closed.set()


def _long_line(handler, outer) -> None:
    try:
        handler.wfile.write(b"data: " + b"x" * (3 << 20))
        handler.wfile.flush()
        outer.release.wait(30)
    except OSError:
        pass


def _forever(handler, outer) -> None:
    try:  # max_tokens ignored: chunks until Parley hangs up
        while not outer.release.is_set():
            handler._send({"choices": [{"delta": {"content": "la "}, "finish_reason": None}]})
            time.sleep(0.005)
    except OSError:
        outer.closed.set()


HOSTILE = {"typed": _typed, "no-done": _no_done, "hold": _hold, "long-line": _long_line, "forever": _forever}


class StallServer:
    def __init__(self, mode: str = "stall"):
        self.mode, self.release, self.closed = mode, threading.Event(), threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_GET(self):
                if outer.mode == "slow-models":
                    outer.release.wait(30)
                    return
                if outer.mode == "big-models":
                    self._json(200, {"object": "list", "data": [{"id": MODEL}], "pad": "x" * (40 << 20)})
                    return
                self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "test"}]})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                if outer.mode == "stall":
                    outer.release.wait(30)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                if outer.mode in HOSTILE:
                    HOSTILE[outer.mode](self, outer)
                    return
                self._send({"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]})
                time.sleep(0.1)
                self.close_connection = True  # "drop": hang up mid-answer, without [DONE]

            def _send(self, chunk: dict | str):
                self.wfile.write(f"data: {chunk if isinstance(chunk, str) else json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()

            def _json(self, status: int, body: dict):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> "StallServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
