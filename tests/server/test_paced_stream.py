"""A stream whose client reads nothing is dropped once a chunk waits `send_timeout_s` (server/paced_stream.py)."""
from __future__ import annotations

import asyncio

import pytest

from server.app import ServerSettings
from server.paced_stream import PacedStream


class _Client:
    """An ASGI send as uvicorn's behaves for a client that reads nothing: the headers go out, then the socket's
    buffers are full and a body chunk waits for room that never comes."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()
        self.sent.append(message)


def test_a_client_that_reads_nothing_ends_its_stream_and_frees_its_turns():
    """Its answers went on and their events piled up (n=64: 35 MB) while the connection stayed open; now the body's
    generator is closed (its `finally` closes the sessions) once a chunk waits the timeout."""
    freed = []

    async def events():
        try:
            while True:
                yield "data: {}\n\n"
        finally:
            freed.append(True)

    client = _Client()
    stream = PacedStream(events(), send_timeout_s=0.05)
    asyncio.run(asyncio.wait_for(stream.stream_response(client.send), 5))
    assert freed == [True] and [m["type"] for m in client.sent] == ["http.response.start"]


def test_the_send_timeout_is_a_setting():
    assert ServerSettings().send_timeout_s >= 10
    for wrong in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="send_timeout_s"):
            ServerSettings(send_timeout_s=wrong)
