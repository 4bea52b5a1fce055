"""A tiny misbehaving OpenAI-compatible server for the remote backend's error paths.

mode "stall": lists its model, then never answers a chat request; "drop": sends one chunk and hangs up;
"slow-models": never answers /v1/models.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "stalling-model"


class StallServer:
    def __init__(self, mode: str = "stall"):
        self.mode, self.release = mode, threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_GET(self):
                if outer.mode == "slow-models":
                    outer.release.wait(30)
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
                chunk = {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.1)
                self.close_connection = True  # "drop": hang up mid-answer, without [DONE]

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
