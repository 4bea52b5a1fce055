"""A streamed answer whose client has stopped reading is dropped, rather than buffered for as long as its connection
stays open."""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

from starlette.responses import StreamingResponse
from starlette.types import Send

log = logging.getLogger("uvicorn.error")


class PacedStream(StreamingResponse):
    """Server-sent events sent no faster than the client takes them (uvicorn's send waits while the socket's buffers
    are full). A chunk not taken within `send_timeout_s` ends the stream: the body iterator is closed (its turns
    cancelled, its sessions closed) and the connection dropped. A client that read nothing held its sessions and every
    event its turns went on making (n=64, 250 tokens, top_logprobs 20: 35 MB) until it hung up."""

    def __init__(self, content: AsyncIterator[str], send_timeout_s: float, headers: dict[str, str] | None = None):
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self.send_timeout_s = send_timeout_s

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                body = {"type": "http.response.body", "body": chunk.encode(self.charset), "more_body": True}
                if not await self._taken(send, body):
                    log.warning("A client took nothing of its stream for %g s: its answers are stopped and the "
                                "connection dropped.", self.send_timeout_s)
                    return  # uvicorn closes a connection whose response did not complete
        finally:
            await self.body_iterator.aclose()  # now, not when the generator is collected: its `finally` frees the turns
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _taken(self, send: Send, message: dict) -> bool:
        try:
            await asyncio.wait_for(send(message), self.send_timeout_s)
        except asyncio.TimeoutError:
            return False
        return True
