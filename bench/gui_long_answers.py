"""How long input waits in the real window while long Markdown answers stream into it (target: key lag p95 < 50 ms).

A Markdown answer of --chars characters made here (headings, paragraphs, lists, Python code fences of 12 and 60
lines, tables) is cut into the embedded model's tokens as the engine's incremental detokenizer streams them. A thread,
in the engine thread's place, pushes them into the app's real EngineBridge as engine events, as the engine sends
them: Started, then one TokenDelta per chat per step, --per-event tokens each (a step's accepted draft tokens) at
--rate steps a second (the embedded model decodes ~75 tokens a second alone on a 2-core Xeon), then Finished.
The engine thread is held meanwhile (the chats' real turns are cancelled once it is let go), so the GUI's work alone
is measured. A second thread posts a probe event every 10 ms and a key press to the composer every 100 ms; their
wait in the event queue is what a user's input would wait. Scenarios: long (one chat), resize (one chat, a 15-step
drag of the window's edge every 1.7 s), switch (4 chats answering, another shown every 0.5 s), compare (the compare
view, 4 columns answering), code (one chat, an answer that is one 190-line Python code block, its last lines streaming),
compare_code (4 compare columns, each streaming that code answer), table (one chat, a 200-row table of countries), list
(one chat, a 300-item numbered list with a note under every 10th item, which three spaces do not nest under a
two-digit number: 60 lists one after another, as CommonMark reads it).
Spans: `head` while the answer streams but its last --tokens tokens, `stream` while those arrive, `finish` from
Finished until every answer is rendered whole; `_key`: the keys; `_loop`: gaps over 50 ms between
ticks of a 10 ms timer on the GUI thread and the share of the span they took (the probe thread needs the GIL to
post, so it posts fewer probes while the GUI thread holds it; the timer sees every stall).
Baseline: the same window idle; with --baseline-src DIR (a git worktree of an older commit) each run also runs from
DIR's tree, interleaved with this one in fresh processes, and the ratios baseline / this are printed last.
Prints JSON lines. Usage: python bench/gui_long_answers.py [--scenarios long resize switch compare] [--rate 60]
       [--per-event 3] [--tokens 600] [--chars 20000] [--baseline-src DIR --rounds 2] [--model-cache DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
HERE = Path(__file__).resolve().parent.parent
SCENARIOS = ("long", "resize", "switch", "compare", "code", "compare_code", "table", "list")
ANSWER_OF = {"code": "code", "compare_code": "code", "table": "table", "list": "list"}  # others stream long_answer()
TARGET_MS = 50.0
PROBE_S, KEY_EVERY = 0.010, 10  # a probe every 10 ms, a key every 10th probe
PROMPT = "Write a long answer in Markdown with code and tables."
WORDS = "the model reads each token and writes a cache row so that later steps attend to it quickly".split()


# -- the answer
def _para(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def _section(i: int, rng: random.Random) -> str:
    lines = 60 if i % 3 == 2 else 12  # every third block long enough to be highlighted in several runs
    code = "\n".join(f"    total_{j} = compute(values[{j}], scale={j}.5)  # step {j}" for j in range(lines))
    rows = "\n".join(f"| item {i}.{j} | {rng.randint(1, 999)} | {_para(rng, 4)} |" for j in range(8))
    return (f"## Part {i}: notes\n\n{_para(rng, 40)} {_para(rng, 30)}\n\n- first point about `x_{i}`\n"
            f"- second **bold** point\n  - a nested point\n- third point\n\n1. one step\n2. another step\n\n"
            f"```python\ndef part_{i}(values):\n{code}\n    return total_0\n```\n\n"
            f"| name | count | note |\n| --- | ---: | --- |\n{rows}\n\n{_para(rng, 50)}\n\n")


def long_answer(chars: int, seed: int = 0) -> str:
    """Markdown of about `chars` characters, the same for a seed."""
    rng, out, size, i = random.Random(seed), [], 0, 0
    while size < chars:
        out.append(_section(i, rng))
        size += len(out[-1])
        i += 1
    return "".join(out)[:chars]


def code_answer(lines: int = 190) -> str:
    """A line of text, then one Python block of `lines` lines (a block streams highlighted up to 200 lines)."""
    body = "\n".join(f"    total_{j} = compute(values[{j}], scale={j}.5)  # step {j}" for j in range(lines))
    return f"Here is the code:\n\n```python\ndef long_part(values):\n{body}\n    return total_0\n```\n"


def table_answer(rows: int = 200) -> str:
    """A line of text, then a table of `rows` countries (models write such tables of 20-200 rows)."""
    rng = random.Random(2)
    body = "".join(f"| Country {i} | City {rng.randint(1, 999)} | {rng.randint(10 ** 5, 10 ** 9):,} | "
                   f"{rng.choice(['Europe', 'Asia', 'Africa', 'Americas'])} |\n" for i in range(rows))
    return f"Here is the table:\n\n| Country | Capital | Population | Region |\n|---|---|---:|---|\n{body}\nDone.\n"


def list_answer(items: int = 300) -> str:
    """A line of text, then a numbered list of `items` items, a note under every 10th indented three spaces as models
    write it (under "10." that does not nest: it ends the list, a bullet list starts, then another numbered list)."""
    rng = random.Random(3)
    body = "".join(f"{i + 1}. Step **{i}**: {_para(rng, 8)}\n" + ("   - a nested note\n" if i % 10 == 9 else "")
                   for i in range(items))
    return f"Here are the steps:\n\n{body}\nDone.\n"


def token_pieces(gguf: str, text: str) -> list[tuple[int, str]]:
    """(token id, the text it adds) as the engine's detokenizer streams `text` in the model's tokens."""
    from engine.loading.gguf_file import open_gguf
    from engine.tokenizer.detokenizer import IncrementalDetokenizer
    from engine.tokenizer.from_gguf import tokenizer_from_gguf

    tok = tokenizer_from_gguf(open_gguf(gguf).metadata)
    detok = IncrementalDetokenizer(tok.decode)
    pieces = [(i, detok.push(i)) for i in tok.encode(text, add_bos=False)]
    pieces[-1] = (pieces[-1][0], pieces[-1][1] + detok.flush())
    assert "".join(p for _, p in pieces) == text, "the pieces do not join to the answer"
    return pieces


# -- measuring
def summary(lags: list[float]) -> dict:
    """Percentiles in ms of lags in seconds, and how many waited over the 50 ms target."""
    xs = sorted(lags)
    at = lambda q: round(xs[min(len(xs) - 1, int(q * (len(xs) - 1)))] * 1e3, 1) if xs else None
    return {"n": len(xs), "p50": at(0.5), "p95": at(0.95), "max": at(1.0),
            "over50": sum(x > TARGET_MS / 1e3 for x in xs)}


class Meter:
    """A thread posts probe events and key presses; the GUI thread notes how long each waited (posted, lag)."""

    def __init__(self, edit):
        from PySide6.QtCore import QEvent, QObject, Qt, QTimer
        from PySide6.QtGui import QInputDevice

        self.probe_type = QEvent.Type(QEvent.registerEventType())
        meter = self

        class Probe(QObject):
            def event(self, e):
                if e.type() == meter.probe_type:
                    meter.lags.append((e.posted, time.perf_counter() - e.posted))
                    return True
                return super().event(e)

            def eventFilter(self, obj, e):
                if e.type() == QEvent.Type.KeyPress and e.timestamp() in meter.posted:
                    t = meter.posted.pop(e.timestamp())
                    meter.keys.append((t, time.perf_counter() - t))
                    if len(obj.toPlainText()) > 200:  # the box stays short: its own layout is not what we measure
                        obj.clear()
                return False

        class ProbeEvent(QEvent):
            def __init__(self):
                super().__init__(meter.probe_type)
                self.posted = time.perf_counter()

        self.probe, self.probe_event = Probe(), ProbeEvent
        QInputDevice.primaryKeyboard()  # made here: the key events the thread makes would make it off the GUI thread
        self.lags: list[tuple[float, float]] = []
        self.keys: list[tuple[float, float]] = []
        self.gaps: list[tuple[float, float]] = []  # (start, length) between ticks of a 10 ms timer on the GUI thread
        self.ticker = QTimer(interval=int(PROBE_S * 1000), timerType=Qt.TimerType.PreciseTimer)
        self.ticker.timeout.connect(self._tick)
        self.posted: dict[int, float] = {}
        self.edit = None
        self.watch(edit)
        self._running = False

    def watch(self, edit) -> None:
        """Keys go to `edit` (the chat's composer or the compare view's)."""
        if self.edit is not None:
            self.edit.removeEventFilter(self.probe)
        self.edit = edit
        edit.installEventFilter(self.probe)

    def start(self) -> None:
        self.lags.clear(), self.keys.clear(), self.posted.clear(), self.gaps.clear()
        self._running = True
        self._thread = threading.Thread(target=self._post, daemon=True)
        self._thread.start()
        self.started = self._last_tick = time.perf_counter()
        self.ticker.start()

    def stop(self) -> None:
        self.ticker.stop()
        self._running = False
        self._thread.join()
        self.stopped = time.perf_counter()

    def _tick(self) -> None:
        # the probes come from a thread that needs the GIL to post; the GUI's own timer does not, so it sees every stall
        now = time.perf_counter()
        self.gaps.append((self._last_tick, now - self._last_tick))
        self._last_tick = now

    def _post(self) -> None:
        from PySide6.QtCore import QEvent, Qt
        from PySide6.QtGui import QKeyEvent
        from PySide6.QtWidgets import QApplication

        k = 0
        while self._running:
            QApplication.postEvent(self.probe, self.probe_event())
            k += 1
            if k % KEY_EVERY == 0:
                press = QKeyEvent(QEvent.Type.KeyPress, Qt.Key.Key_A, Qt.KeyboardModifier.NoModifier, "a")
                press.setTimestamp(k)
                self.posted[k] = time.perf_counter()
                QApplication.postEvent(self.edit, press)
                QApplication.postEvent(self.edit, QKeyEvent(QEvent.Type.KeyRelease, Qt.Key.Key_A,
                                                            Qt.KeyboardModifier.NoModifier, "a"))
            time.sleep(PROBE_S)

    def split(self, streaming_at: float, finished_at: float) -> dict:
        """Lags while the answer's head renders, while tokens stream, and after Finished (the final render), each
        counted where the GUI thread saw it (a probe that waited on the final render is the final render's)."""
        spans = {"head": (self.started, streaming_at), "stream": (streaming_at, finished_at),
                 "finish": (finished_at, self.stopped)}
        out = {}
        for name, (a, b) in spans.items():
            out[name] = summary([lag for t, lag in self.lags if a <= t + lag < b])
            out[f"{name}_key"] = summary([lag for t, lag in self.keys if a <= t + lag < b])
            out[f"{name}_loop"] = self.loop(a, b)
        return out

    def loop(self, a: float, b: float) -> dict:
        """The GUI timer's gaps over 50 ms that ended between a and b, and the share of that span they took."""
        stalls = [(t, gap) for t, gap in self.gaps if a <= t + gap < b and gap > TARGET_MS / 1e3]
        inside = sum(t + gap - max(t, a) for t, gap in stalls)
        return {"s": round(b - a, 2), "stalls_over50": len(stalls),
                "max_stall": round(max((g for _, g in stalls), default=0.0) * 1e3, 1),
                "stalled_share": round(inside / (b - a), 3)}


# -- driving the window
def wait(seconds: float) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()


def wait_until(pred, timeout: float) -> bool:
    end = time.perf_counter() + timeout
    while not pred() and time.perf_counter() < end:
        wait(0.05)
    return pred()


@dataclass
class Feed:
    """Engine events for `turns` from a thread, as the engine sends them: a delta per turn per step."""

    bridge: object
    turns: list[tuple[int, int]]  # (session, turn)
    pieces: list[tuple[int, str]]
    streamed: int  # the last this many pieces are the `stream` span
    rate: float  # steps a second
    per_event: int = 1  # tokens a step (a step's accepted draft tokens)
    streaming_at: float = 0.0
    finished_at: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        from engine import events as ev

        emit, head = self.bridge._on_engine_event, len(self.pieces) - self.streamed
        for sid, tid in self.turns:
            emit(ev.Started(sid, tid))
        t0 = time.perf_counter()
        for k, at in enumerate(range(0, len(self.pieces), self.per_event), 1):
            step = self.pieces[at:at + self.per_event]
            if not self.streaming_at and at + len(step) > head:
                self.streaming_at = time.perf_counter()
            for sid, tid in self.turns:
                emit(ev.TokenDelta(sid, tid, [t for t, _ in step], "".join(p for _, p in step)))
            time.sleep(max(0.0, t0 + k / self.rate - time.perf_counter()))
        text = "".join(p for _, p in self.pieces)
        stats = ev.TurnStats(10, 10, len(self.pieces), 0.1, self.rate, len(self.pieces) + 10, 131072)
        self.finished_at = time.perf_counter()
        for sid, tid in self.turns:
            emit(ev.Finished(sid, tid, "length", text, stats))
        self.done.set()


class HeldEngine:
    """The engine thread kept busy in a call, so the chats' real turns wait; let go, it cancels them first."""

    def __init__(self, engine):
        self.engine, self._release, self._held = engine, threading.Event(), threading.Event()

    def __enter__(self) -> "HeldEngine":
        hold = lambda _engine: (self._held.set(), self._release.wait(900))
        threading.Thread(target=lambda: self.engine.call(hold, timeout=960), daemon=True).start()
        assert self._held.wait(30), "the engine thread did not take the call"
        return self

    def __exit__(self, *exc) -> None:
        self._release.set()


class Resizer:
    """A drag of the window's edge every 1.7 s: 15 steps 16 ms apart, to the next of three sizes."""

    SIZES = [(1200, 800), (900, 700), (1400, 900)]

    def __init__(self, window):
        from PySide6.QtCore import QTimer

        self.window, self.k = window, 0
        self.timer = QTimer(interval=1700)
        self.timer.timeout.connect(self.drag)

    def drag(self) -> None:
        from PySide6.QtCore import QTimer

        self.k += 1
        (w0, h0), (w1, h1) = self.SIZES[(self.k - 1) % 3], self.SIZES[self.k % 3]
        for i in range(1, 16):
            size = (w0 + (w1 - w0) * i // 15, h0 + (h1 - h0) * i // 15)
            QTimer.singleShot(16 * i, lambda size=size: self.window.resize(*size))


def start_turns(app, name: str, chats: int) -> tuple[list[int], list[tuple[int, int]]]:
    """Sends the prompt in new chats (or compare columns); the held engine gets their turns, we their ids."""
    window, service = app.window, app.service
    if name.startswith("compare"):
        window.show_compare()
        window.compare.set_columns(chats)
        convs = [c.conv_id for c in window.compare.columns]
        window.compare.send(PROMPT)
    else:
        convs = [window.new_chat() for _ in range(chats)]
        for conv in convs:
            window.open_chat(conv)
            window.chat.send(PROMPT)
        window.open_chat(convs[0])
    turns = [(service.live(c).session_id, service.live(c).turn.turn_id) for c in convs]
    return convs, turns


def renders(window) -> int:
    """Message documents built so far by the chat page's view and the compare columns'."""
    return window.chat.view.delegate.renders + sum(c.view.delegate.renders for c in window.compare.columns)


def run_scenario(app, name: str, pieces: list[tuple[int, str]], args, meter: Meter) -> dict:
    from PySide6.QtCore import QTimer

    window, service = app.window, app.service
    window.resize(1200, 800)
    wait(0.3)
    chats = 4 if name in ("switch", "compare", "compare_code") else 1
    built, flushes = renders(window), app.bridge.flushes
    with HeldEngine(app.bridge.engine):
        convs, turns = start_turns(app, name, chats)
        meter.watch(window.compare.composer.edit if name.startswith("compare") else window.chat.composer.edit)
        feed = Feed(app.bridge, turns, pieces, min(args.tokens, len(pieces) - 1), args.rate, args.per_event)
        timers = []
        if name == "switch":
            shown = iter(range(1, 10 ** 6))
            timers.append(QTimer(interval=500))
            timers[-1].timeout.connect(lambda: window.open_chat(convs[next(shown) % len(convs)]))
        resizer = Resizer(window) if name == "resize" else None
        if resizer:
            timers.append(resizer.timer)
        load = os.getloadavg()[0]
        meter.start()
        started = time.perf_counter()
        feed.start()
        for t in timers:
            t.start()
        answered = lambda: feed.done.is_set() and not any(service.busy(c) for c in convs)
        wait_until(answered, len(pieces) / args.per_event / args.rate + 300)
        wait(0.5)
        for t in timers:
            t.stop()
        meter.stop()
        seconds = time.perf_counter() - started
    answers = [service.store.path(c)[-1] for c in convs]
    wait_until(lambda: not any(service.busy(c) for c in convs), 30)
    return {"bench": "gui_long_answers", "scenario": name, "chats": chats,
            **meter.split(feed.streaming_at, feed.finished_at),
            "answer_chars": len(answers[0].content), "answered": sum(a.state == "done" for a in answers),
            "tokens_streamed": feed.streamed, "rate": args.rate, "per_event": args.per_event, "seconds": round(seconds, 1),
            "renders": renders(window) - built, "flushes": app.bridge.flushes - flushes,
            "load_avg_1m": round(load, 2), "cpus": os.cpu_count()}


def measure(args) -> int:
    """This process: every scenario in one window, on the source tree at args.src."""
    sys.path.insert(0, str(Path(args.src).resolve()))
    from app.qt import main as app_main
    from bench.gui_harness import fresh_data_dir

    build, qt_app = app_main.build, app_main.qt_app
    qt_app()
    data_dir = fresh_data_dir(args.model_cache)
    app = build(data_dir, theme="light")
    try:
        if not wait_until(lambda: app.models.model_id("default") is not None, 300):
            print(json.dumps({"bench": "gui_long_answers", "error": "the embedded model did not load"}), flush=True)
            return 1
        gguf = app.models.file_of("default")
        answers = {"long": long_answer(args.chars), "code": code_answer(), "table": table_answer(),
                   "list": list_answer()}
        pieces = {kind: token_pieces(gguf, answers[kind]) for kind in {ANSWER_OF.get(n, "long") for n in args.scenarios}}
        tree = {"tree": args.tree or str(Path(args.src).resolve()), "src": str(Path(app_main.__file__).parents[2])}
        meter = Meter(app.window.chat.composer.edit)
        meter.start()
        wait(2.0)
        meter.stop()
        idle = {"lag": summary([x for _, x in meter.lags]), "key": summary([x for _, x in meter.keys]),
                "loop": meter.loop(meter.started, meter.stopped)}
        print(json.dumps({"bench": "gui_long_answers", "scenario": "idle", **tree, **idle}), flush=True)
        for name in args.scenarios:
            answer = pieces[ANSWER_OF.get(name, "long")]
            row = run_scenario(app, name, answer, args, meter)
            row["pass"] = row["stream_key"]["p95"] is not None and row["stream_key"]["p95"] < TARGET_MS
            print(json.dumps({**row, **tree, "tokens_total": len(answer)}), flush=True)
    finally:
        app.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


# -- before / after
RATIOS = (("stream", "p50"), ("stream", "p95"), ("stream_key", "p50"), ("stream_key", "p95"),
          ("stream_loop", "stalled_share"), ("finish_loop", "max_stall"))


def ratios(rows: list[dict], baseline: str, this: str) -> list[dict]:
    """Per scenario and figure: the median over rounds from each tree and baseline / this (above 1: this waits less)."""
    out = []
    for name in dict.fromkeys(r["scenario"] for r in rows if r["scenario"] != "idle"):
        row = {"bench": "gui_long_answers", "scenario": name, "ratio": "baseline / this", "baseline": baseline,
               "this": this}
        for part, key in RATIOS:
            # a span with no probe in it (a stall over all of it) has no percentiles
            of = lambda tree: [r[part][key] for r in rows if r["scenario"] == name and r["tree"] == tree
                               and r[part][key] is not None]
            b, t = (round(statistics.median(of(tree)), 3) if of(tree) else None for tree in (baseline, this))
            row[f"{part}_{key}"] = [b, t, round(b / t, 2) if b is not None and t else None]
        out.append(row)
    return out


def interleave(args) -> int:
    """Each round runs the baseline tree, then this one, each in a fresh process; then prints the ratios."""
    rows = []
    for _ in range(args.rounds):
        for src, tree in ((args.baseline_src, "baseline"), (str(HERE), "this")):
            cmd = [sys.executable, __file__, "--src", src, "--tree", tree, "--rate", str(args.rate), "--per-event",
                   str(args.per_event), "--tokens",
                   str(args.tokens), "--chars", str(args.chars), "--model-cache", args.model_cache, "--scenarios",
                   *args.scenarios]
            done = subprocess.run(cmd, capture_output=True, text=True)
            for line in done.stdout.splitlines():
                print(line, flush=True)
                rows.append(json.loads(line))
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)
                return done.returncode
    for row in ratios([r for r in rows if "scenario" in r], "baseline", "this"):
        print(json.dumps(row), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--rate", type=float, default=60.0, help="steps a second (a delta per chat a step)")
    p.add_argument("--per-event", type=int, default=3, help="tokens a step (a step's accepted draft tokens)")
    p.add_argument("--tokens", type=int, default=600, help="the answer's last tokens: the `stream` span")
    p.add_argument("--chars", type=int, default=20_000, help="the answer's length (60,000: ~80 s a scenario)")
    p.add_argument("--src", default=str(HERE), help="the source tree whose app is measured")
    p.add_argument("--tree", default="", help="a name for --src in the rows")
    p.add_argument("--baseline-src", default="", help="also run this tree, interleaved, and print the ratios")
    p.add_argument("--rounds", type=int, default=2, help="with --baseline-src: runs of each tree")
    p.add_argument("--model-cache", default=str(Path(tempfile.gettempdir()) / "parley-bench"),
                   help="keeps the assembled model between runs; chats start empty every run")
    args = p.parse_args()
    return interleave(args) if args.baseline_src else measure(args)


if __name__ == "__main__":
    sys.exit(main())
