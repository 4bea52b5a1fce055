"""What the sidebar asks of the chat store at each refresh, over a store of N chats (two messages each, built with the
store's API), the store of a git ref (--before) against the working tree's, in one process, the rounds interleaved.

Each round times, for both stores on their own copies of one file: conversations(), ChatService.visible() (the list),
visible(text, hits) (a search's results landing, one answer streaming), and the changes the list follows: a new chat,
a reply, pin, unpin, rename, delete. Each figure is the median of --reps calls in ms; the two stores' lists are checked
equal after every change. Prints JSON lines: one per store, chats and round, then per chats the medians over rounds.
Usage: python bench/store_listing.py --before REF [--chats 3000 20000] [--rounds 5] [--reps 21] [--cache DIR]
"""
from __future__ import annotations

import argparse
import gc
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.signals import BoundSignal  # noqa: E402
from bench.common import emit, median_time  # noqa: E402

WORDS = "the weather was cold and the wind came over the hills while we talked about rain in the city".split()
TEXT = "wind"
MODULES = ("conversations", "sqlite_store", "chats")  # app/core files whose imports of each other are rewired


def modules_at(ref: str) -> dict[str, types.ModuleType]:
    """app/core's store and service as they were at `ref`, importing each other (and the rest of app/ as it is now)."""
    loaded: dict[str, types.ModuleType] = {}
    for name in MODULES:
        source = subprocess.run(["git", "show", f"{ref}:app/core/{name}.py"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
        for other in loaded:
            source = source.replace(f"from app.core.{other} import", f"from _before_{other} import")
        module = types.ModuleType(f"_before_{name}")
        sys.modules[module.__name__] = module
        exec(compile(source, f"{ref}:app/core/{name}.py", "exec"), module.__dict__)
        loaded[name] = module
    return loaded


def build(path: Path, chats: int) -> None:
    from app.core.sqlite_store import SqliteConversationStore

    path.parent.mkdir(parents=True, exist_ok=True)
    store, rng = SqliteConversationStore(path), random.Random(chats)
    with store.batch():
        for i in range(chats):
            conv = store.create(f"Chat {i} " + rng.choice(WORDS))
            q = store.add_message(conv.id, None, "user", " ".join(rng.choice(WORDS) for _ in range(12)))
            store.add_message(conv.id, q.id, "assistant", " ".join(rng.choice(WORDS) for _ in range(30)))
    store.close()


def service(chats_module, store):
    bridge = types.SimpleNamespace(**{name: BoundSignal() for name in (
        "turn_started", "turn_queued", "text_arrived", "turn_finished", "turn_failed", "context_usage")})
    models = types.SimpleNamespace(loaded=BoundSignal(), failed=BoundSignal(), ensure=lambda *_: None)
    return chats_module.ChatService(store, bridge, models)


def median_ms(fn, reps: int) -> float:
    return median_time(fn, reps) * 1000


def change_ms(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def one_round(svc, reps: int, r: int) -> dict:
    """The figures of one round on one store; the same changes on each store, so their lists stay alike."""
    store = svc.store
    ids = [c.id for c in store.conversations()]
    middle, hits = ids[len(ids) // 2], store.message_search(TEXT)(lambda: False)
    row = {"conversations": median_ms(store.conversations, reps), "visible": median_ms(svc.visible, reps),
           "search_lands": median_ms(lambda: svc.visible(TEXT, hits), reps)}
    new = store.create(f"New chat {r}")
    row["new_chat"] = change_ms(svc.visible)
    row["reply"] = change_ms(lambda: store.add_message(middle, None, "user", "a reply")) + change_ms(svc.visible)
    row["pin"] = change_ms(lambda: store.update(ids[len(ids) // 3], pinned=True)) + change_ms(svc.visible)
    row["unpin"] = change_ms(lambda: store.update(ids[len(ids) // 3], pinned=False)) + change_ms(svc.visible)
    row["rename"] = change_ms(lambda: store.update(ids[5], title=f"Renamed {r}")) + change_ms(svc.visible)
    row["delete"] = change_ms(lambda: store.delete(new.id)) + change_ms(svc.visible)
    return row


def run(n: int, stores: dict, rounds: int, reps: int) -> None:
    rows: dict[str, list[dict]] = {name: [] for name in stores}
    gc.disable()  # as the app: collection off, on a timer of its own (app/qt/gui_collector.py), never in a refresh
    for r in range(rounds):
        for name in (list(stores) if r % 2 == 0 else list(stores)[::-1]):
            row = one_round(stores[name], reps, r)
            rows[name].append(row)
            emit(store=name, chats=n, round=r, **{k: round(v, 3) for k, v in row.items()})
        lists = [[c.id for c in svc.visible()] for svc in stores.values()]
        assert all(ids == lists[0] for ids in lists), "the stores list their chats differently"
        gc.collect()
    gc.enable()
    for name, got in rows.items():
        emit(store=name, chats=n, medians={k: round(statistics.median(row[k] for row in got), 3) for k in got[0]},
             spread={k: [round(min(row[k] for row in got), 3), round(max(row[k] for row in got), 3)] for k in got[0]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git ref of the store to compare against")
    parser.add_argument("--chats", type=int, nargs="+", default=[3000, 20000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench" / "store-listing")
    args = parser.parse_args()
    import app.core.chats as chats_now
    from app.core.sqlite_store import SqliteConversationStore

    before = modules_at(args.before)
    kinds = {"before": (before["sqlite_store"].SqliteConversationStore, before["chats"]),
             "after": (SqliteConversationStore, chats_now)}
    for n in args.chats:
        made = args.cache / str(n) / "parley.db"
        if not made.exists():
            build(made, n)
        work, stores = Path(tempfile.mkdtemp(prefix="store-listing-")), {}
        for name, (store_class, chats_module) in kinds.items():  # a copy each: one store per data folder
            (work / name).mkdir()
            shutil.copy(made, work / name / "parley.db")
            store = store_class(work / name / "parley.db")
            live = store.create("Live")
            answer = store.add_message(live.id, None, "assistant", state="streaming")
            store.append_text(answer.id, f"the {TEXT} rose")  # one answer being written: found off the index
            stores[name] = service(chats_module, store)
        run(n, stores, args.rounds, args.reps)
        for svc in stores.values():
            svc.store.close()
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
