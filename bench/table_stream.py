"""GUI-thread time a token costs while a long Markdown table streams into a chat's document, its rows one table or
chunks of growing_block.CHUNK_ROWS rows (app/qt/table_chunks.py), in one process, the rounds interleaved.

A table of --rows rows (4 columns: text, emphasis, numbers, code) goes into a document laid out as the chat view's
(width --width, its style sheet) all but its last --tail rows at once; those then stream --step characters an update.
Each update is timed in the GUI thread's CPU time (time.thread_time: the machine is shared): the answer's render, the
document's update and its layout (doc.size(), as the view asks next). Then `end`: the first words after the table (it is
complete: its chunks become one table), and `done`: the answer ends. Mode `one` is the table before chunks (CHUNK_ROWS
past any table), `chunks` as shipped.
Prints JSON lines: one per mode, rows and round (p50/p90/max of the streamed updates in ms, end_ms, done_ms), then per
rows the medians over rounds and the ratio one / chunks.
Usage: python bench/table_stream.py [--rows 100 200 400] [--rounds 3] [--tail 8] [--step 4] [--width 700]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from PySide6.QtWidgets import QApplication  # noqa: E402

import app.core.growing_block as growing_block  # noqa: E402
from app.core.conversations import Message  # noqa: E402
from app.core.markdown_render import MarkdownRenderer  # noqa: E402
from app.core.message_html import message_html  # noqa: E402
from app.qt.chat_view import _stylesheet  # noqa: E402
from app.qt.stream_document import SafeDocument, StreamDocument  # noqa: E402

MODES = {"one": 10 ** 9, "chunks": growing_block.CHUNK_ROWS}  # CHUNK_ROWS of each mode


def table_text(rows: int) -> str:
    body = "".join(f"| Country {i} | *City* {i * 7 % 13} | {i * 1234:,} | `r{i}` |\n" for i in range(rows))
    return f"Here is the table:\n\n| Country | Capital | Population | Code |\n|:---|---|---:|:-:|\n{body}"


def _timed(stream: StreamDocument, renderer: MarkdownRenderer, text: str, state: str) -> float:
    """ms of GUI-thread CPU: render, document update, layout."""
    start = time.thread_time()
    msg = Message(1, 1, None, "assistant", text, state)
    stream.update(list(message_html(msg, 1, 1, renderer, busy=state == "streaming").parts))
    stream.doc.size()
    return (time.thread_time() - start) * 1e3


def run(app: QApplication, mode: str, rows: int, tail: int, step: int, width: int) -> dict:
    growing_block.CHUNK_ROWS = MODES[mode]
    renderer, text = MarkdownRenderer(), table_text(rows)
    doc = SafeDocument()
    doc.setDocumentMargin(0)
    doc.setDefaultFont(app.font())
    doc.setDefaultStyleSheet(_stylesheet(app.palette()))
    doc.setTextWidth(width)
    stream = StreamDocument(doc)
    start = len(table_text(rows - tail))
    _timed(stream, renderer, text[:start], "streaming")
    times = [_timed(stream, renderer, text[:n], "streaming") for n in range(start + step, len(text) + 1, step)]
    after = text + "\nAfter the table, a few words."
    end = _timed(stream, renderer, after, "streaming")
    done = _timed(stream, renderer, after, "done")
    q = statistics.quantiles(times, n=10)
    return {"mode": mode, "rows": rows, "updates": len(times), "p50_ms": round(statistics.median(times), 2),
            "p90_ms": round(q[-1], 2), "max_ms": round(max(times), 2), "end_ms": round(end, 2),
            "done_ms": round(done, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100, 200, 400])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tail", type=int, default=8)
    parser.add_argument("--step", type=int, default=4)
    parser.add_argument("--width", type=int, default=700)
    args = parser.parse_args()
    app = QApplication.instance() or QApplication([])
    print(json.dumps({"load": os.getloadavg(), "chunk_rows": MODES["chunks"], "clock": "thread_time"}), flush=True)
    results: dict[tuple[str, int], list[dict]] = {}
    for r in range(args.rounds):
        for rows in args.rows:
            for mode in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
                rec = run(app, mode, rows, args.tail, args.step, args.width)
                results.setdefault((mode, rows), []).append(rec)
                print(json.dumps({"round": r, **rec}), flush=True)
    growing_block.CHUNK_ROWS = MODES["chunks"]
    for rows in args.rows:
        line = {"rows": rows}
        for key in ("p50_ms", "p90_ms", "max_ms", "end_ms", "done_ms"):
            one, chunks = (statistics.median(rec[key] for rec in results[(mode, rows)]) for mode in MODES)
            line[key] = {"one": one, "chunks": chunks, "ratio": round(one / chunks, 2)}
        print(json.dumps(line), flush=True)
    print(json.dumps({"load": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
