"""Unloading a model: its chats close, its memory goes, and it can be loaded again."""
from __future__ import annotations

import pytest

from engine.runtime import EngineConfig
from engine.sampling import SamplingParams


def test_unloading_a_model_closes_its_chats_and_frees_it(tiny_models):
    """Engine.unload_model: ModelUnloaded, the model's sessions are gone (a turn on one errs plainly), a new load
    of the same file works."""
    import gc
    import weakref

    from cli.engine_cli import EngineCLI
    from engine import events as ev
    from engine.errors import ParleyError

    cli = EngineCLI(EngineConfig(max_sessions=2, max_session_tokens=128))
    try:
        model_id, _ = cli.load(tiny_models["llama"].gguf_path)
        lm = cli.engine.loaded_model(model_id)
        weights = weakref.ref(next(lm.model.parameters()))
        sid = cli.engine.open_session(model_id)
        cli.run([cli.engine.submit(sid, [{"role": "user", "content": "hi"}], SamplingParams(max_tokens=3))])
        cli.engine.unload_model(model_id)
        while not isinstance(e := cli.engine.events.get(timeout=30), ev.ModelUnloaded):
            pass
        assert e.model_id == model_id
        gc.collect()
        assert lm.model is None and weights() is None  # the weights are released
        turn = cli.engine.submit(sid, [{"role": "user", "content": "again"}], SamplingParams(max_tokens=3))
        cli.run([turn])
        with pytest.raises(ParleyError, match="does not exist"):
            cli.result(turn)
        again, _ = cli.load(tiny_models["llama"].gguf_path)
        sid = cli.engine.open_session(again)
        cli.run([t := cli.engine.submit(sid, [{"role": "user", "content": "hi"}], SamplingParams(max_tokens=3))])
        assert cli.result(t).stats.completion_tokens == 3
    finally:
        cli.close()


def test_an_unloaded_model_s_cache_and_tokenizer_go_at_once(tiny_models):
    """Unloading the last model freed its weights but not its runtime (KV cache, tokenizer, prefix cache): the
    engine loop's variable, the last prompt job and a host <-> runtime cycle kept it (~95 MB more resident per
    load/unload cycle of the embedded model). Now it goes by reference counting alone, before any collection."""
    import gc
    import weakref

    from cli.engine_cli import EngineCLI
    from engine import events as ev

    cli = EngineCLI(EngineConfig(max_sessions=2, max_session_tokens=128))
    gc.disable()  # only reference counting: a cycle or a stray reference keeps it
    try:
        model_id, _ = cli.load(tiny_models["llama"].gguf_path)
        runtime = cli.engine.call(lambda engine: weakref.ref(engine._hosts[model_id].runtime))
        sid = cli.engine.open_session(model_id)
        cli.run([cli.engine.submit(sid, [{"role": "user", "content": "hi"}], SamplingParams(max_tokens=3))])
        cli.engine.unload_model(model_id)
        while not isinstance(cli.engine.events.get(timeout=30), ev.ModelUnloaded):
            pass
        assert runtime() is None
    finally:
        gc.enable()
        cli.close()


def test_a_command_queued_behind_an_unload_finds_the_model_gone(tiny_models):
    """The engine settled each model in a loop before running the commands it drained, and the loop's variable held
    the last model until every command queued with the unload had run: the model outlived its unload and the memory
    given back after it (the embedded model's app stayed ~73 MiB larger after each unload), and the app's collection
    after the unload, run meanwhile, froze its chat template's ~350 objects (3-6 unloads in 30)."""
    import gc
    import threading
    import weakref
    from concurrent.futures import Future

    from cli.engine_cli import EngineCLI
    from engine import commands as cmd

    cli = EngineCLI(EngineConfig(max_sessions=2, max_session_tokens=128))
    gc.disable()  # only reference counting: a stray reference keeps it
    try:
        model_id, _ = cli.load(tiny_models["llama"].gguf_path)
        runtime = cli.engine.call(lambda engine: weakref.ref(engine._hosts[model_id].runtime))
        gate, after = threading.Event(), Future()
        cli.engine._post(gate.wait, 30)  # holds the engine inside one drain until the commands below are queued
        cli.engine.unload_model(model_id)
        cli.engine._put(cmd.Call(fn=lambda engine: runtime() is None, future=after))
        gate.set()
        assert after.result(30), "the unloaded model's runtime was alive for the next command"
    finally:
        gc.enable()
        cli.close()
