"""`parley serve --model` given the same model twice."""
from __future__ import annotations

import socket

from cli.main import main


def test_one_model_named_twice_is_refused_before_it_loads(tiny_models, tmp_path, capsys):
    """It loaded twice (twice the memory) and the copy was served as 'tiny (2)'. The port is taken, so a command that
    got past the check would say 'Cannot listen' instead of serving."""
    gguf = tiny_models["qwen3"].gguf_path
    again = gguf.parent / ".." / gguf.parent.name / gguf.name  # another spelling of the same file
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code = main(["--data-dir", str(tmp_path), "serve", "--port", str(taken.getsockname()[1]),
                     "--model", str(gguf), "--model", str(again)])
    assert code == 2
    assert capsys.readouterr().err == (f"parley: argument --model: {again} is the model of --model {gguf} again; each "
                                       "model loads once (--max-sessions serves more requests at once)\n")
