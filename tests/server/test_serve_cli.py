"""`parley serve` as a real process: the subcommand's wiring, from argv to a listening server."""
from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys
import time

import httpx
import pytest
import openai

from server.run import free_port


def test_parley_serve_subprocess(tiny_models, tmp_path):
    port, key = free_port(), "sk-cli"
    cmd = [sys.executable, "-m", "cli.main", "--data-dir", str(tmp_path), "serve", "--model",
           str(tiny_models["llama"].gguf_path), "--port", str(port), "--api-key", key, "--context", "256",
           "--max-body-mb", "1", "--allow-host", "proxy.example"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "timeout"
            time.sleep(0.2)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        model = c.models.list().data[0]
        assert model.model_extra["max_model_len"] == 256
        r = c.chat.completions.create(model=str(tiny_models["llama"].gguf_path), temperature=0, max_tokens=5,
                                      messages=[{"role": "user", "content": "hi"}])  # the --model spec is an alias
        assert r.usage.completion_tokens >= 1 and r.model == model.id
        url, auth = f"http://127.0.0.1:{port}/v1/chat/completions", {"Authorization": f"Bearer {key}"}
        big = httpx.post(url, headers=auth, json={"messages": [{"role": "user", "content": "x" * (2 << 20)}]})
        assert big.status_code == 413  # --max-body-mb 1
        models = f"http://127.0.0.1:{port}/v1/models"
        assert httpx.get(models, headers={**auth, "Host": "proxy.example"}).status_code == 200  # --allow-host
        assert httpx.get(models, headers={**auth, "Host": "evil.example"}).status_code == 421
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode in (0, 130), out
    assert f"serving {model.id}" in out


def test_a_port_it_cannot_listen_on_is_one_line_before_any_model_loads(tmp_path):
    import socket

    from cli.main import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        started = time.monotonic()
        code = main(["--data-dir", str(tmp_path), "serve", "--port", str(busy), "--model", str(tmp_path / "none.gguf")])
    assert code == 2 and time.monotonic() - started < 5  # no model was read: that one does not even exist
    for bad in (["--port", "70000"], ["--port", "-1"], ["--max-body-mb", "nan"], ["--context", "0"]):
        proc = subprocess.run([sys.executable, "-m", "cli.main", "serve", *bad], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and f"argument {bad[0]}" in proc.stderr, proc.stderr


def test_listening_socket_names_the_address_and_the_reason():
    import socket

    import pytest

    from server.run import listening_socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ValueError, match=f"127.0.0.1:{taken.getsockname()[1]}: .*in use"):
            listening_socket("127.0.0.1", taken.getsockname()[1])
    with pytest.raises(ValueError, match="'999.1.1.1': not an address or a known host name"):
        listening_socket("999.1.1.1", 8000)
    sock = listening_socket("127.0.0.1", 0)
    assert sock.getsockname()[1] > 0
    sock.close()


def test_a_client_that_connects_on_reading_the_url_is_not_refused():
    """`parley: listening on URL` comes before uvicorn's first accept: the socket must already listen (a bound one
    refuses connections)."""
    import socket

    from server.run import listening_socket, open_for_clients

    with listening_socket("127.0.0.1", 0) as sock:
        url = open_for_clients(sock)
        assert url == f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        with socket.create_connection(sock.getsockname()[:2], timeout=5):
            pass


def test_serve_says_where_it_listens_also_on_a_port_it_picked(tiny_models, tmp_path):
    """`--port 0` takes any free port: the URL printed is the only way a user learns which."""
    import queue
    import re
    import threading

    cmd = [sys.executable, "-m", "cli.main", "--data-dir", str(tmp_path), "serve", "--model",
           str(tiny_models["llama"].gguf_path), "--port", "0", "--context", "64"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        deadline, seen = time.monotonic() + 90, []
        while not (found := re.search(r"listening on (http://127\.0\.0\.1:\d+/v1)", "".join(seen))):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(seen)
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                pass
        assert httpx.get(found.group(1).removesuffix("/v1") + "/health", timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_counts_past_what_a_machine_batches_or_in_other_digits_are_refused_as_flags(capsys):
    """--max-sessions 10**20 failed the load with "OverflowError('Python int too large to convert to C ssize_t')",
    2**31 built the cache's books for minutes before any answer; --port ² said "invalid _port value"."""
    from cli.main import build_parser

    parse = build_parser().parse_args
    assert parse(["serve", "--max-sessions", "65536", "--port", "８０８０"]).max_sessions == 65536
    for argv, said in ((["--max-sessions", "65537"], "--max-sessions: a whole number from 1 to 65,536, not '65537'"),
                       (["--max-sessions", str(10**20)], "--max-sessions: a whole number from 1 to 65,536"),
                       (["--max-sessions", "²"], "--max-sessions: a whole number from 1 to 65,536, not '²'"),
                       (["--port", "²"], "--port: a port is a whole number from 0 to 65535, not '²'"),
                       (["--context", "²"], "--context: a whole number of at least 1, not '²'")):
        with pytest.raises(SystemExit) as stop:
            parse(["serve", *argv])
        assert stop.value.code == 2 and said in capsys.readouterr().err



def test_a_log_on_a_full_disk_does_not_stop_the_server(tiny_models, tmp_path, monkeypatch):
    """`parley serve >log 2>&1` with the log's disk full (a 40 MB tmpfs) exited 1 before it listened, on its own
    'parley: serving …' line (OSError 28; its traceback unwritable too), where uvicorn drops its own lines and serves.
    Parley's lines are dropped as well now. Stderr is /dev/full here; the server's run is noted, not run."""
    import server.run
    from cli.main import main

    class Run:
        def run(self, sockets):
            ran.append(sockets)

    ran, full = [], open("/dev/full", "w", buffering=1)  # line by line, as sys.stderr
    monkeypatch.setattr(server.run, "make_server", lambda *args, **kwargs: Run())
    monkeypatch.setattr(sys, "stderr", full)
    try:
        assert main(["--data-dir", str(tmp_path), "serve", "--model", str(tiny_models["llama"].gguf_path), "--port",
                     "0", "--context", "256"]) == 0
    finally:
        monkeypatch.undo()
        with contextlib.suppress(OSError):  # what could not be written is still held to write
            full.close()
    assert len(ran) == 1


def test_a_remote_key_without_a_remote_endpoint_is_refused(tmp_path, capsys, monkeypatch):
    """`parley serve --remote-api-key KEY` (taken for the key clients must send) served the model to anyone: the key
    is only ever sent to --remote endpoints. $PARLEY_REMOTE_API_KEY alone stays unread, as any unused variable."""
    from cli.main import main

    argv = ["--data-dir", str(tmp_path), "serve", "--port", "0", "--model", str(tmp_path / "none.gguf")]
    assert main([*argv, "--remote-api-key", "secret"]) == 2
    assert capsys.readouterr().err == ("parley: argument --remote-api-key: it is the key sent to --remote endpoints, "
                                       "and none is given; the key this server's clients must send is --api-key\n")
    monkeypatch.setenv("PARLEY_REMOTE_API_KEY", "secret")
    assert main(argv) == 2 and "Model not found" in capsys.readouterr().err  # on to the load, as before


def test_allowed_hosts_beside_a_wildcard_address_are_refused(tmp_path, capsys):
    """`--host 0.0.0.0 --allow-host proxy.lan` answered to any name (a server listening everywhere does), though the
    flag reads as the names let in."""
    from cli.main import main

    argv = ["--data-dir", str(tmp_path), "serve", "--port", "0", "--model", str(tmp_path / "none.gguf"),
            "--allow-host", "proxy.lan"]
    for host in ("0.0.0.0", "::"):
        assert main([*argv, "--host", host]) == 2
        assert capsys.readouterr().err == (f"parley: argument --allow-host: --host {host} answers to any name already "
                                           "(--api-key is its guard); leave out --allow-host, or listen on one "
                                           "address\n")
    assert main([*argv, "--host", "127.0.0.1"]) == 2 and "Model not found" in capsys.readouterr().err  # as before


def test_a_load_s_notices_are_said_before_it_serves(tiny_models, tmp_path, capsys, monkeypatch):
    """A drafter of another tokenizer loaded and served drafting from the prompt: generate and the app said so,
    serve printed nothing (the load's notices never left the bridge)."""
    import server.run
    from cli.main import main

    class Run:
        def run(self, sockets):
            pass

    monkeypatch.setattr(server.run, "make_server", lambda *args, **kwargs: Run())
    assert main(["--data-dir", str(tmp_path), "serve", "--model", str(tiny_models["llama"].gguf_path), "--port", "0",
                 "--context", "256", "--draft-model", str(tiny_models["qwen3"].gguf_path)]) == 0
    err = capsys.readouterr().err
    assert "cannot draft for" in err and err.index("cannot draft for") < err.index("serving")


def test_a_load_s_notice_is_one_line_alike_from_generate_chat_and_serve(tiny_models, tmp_path, capsys, monkeypatch):
    """serve said 'parley: qwen3 cannot draft for …', generate and chat the same words without 'parley: '."""
    import server.run
    from cli.main import main

    class Run:
        def run(self, sockets):
            pass

    monkeypatch.setattr(server.run, "make_server", lambda *args, **kwargs: Run())
    monkeypatch.setattr("sys.stdin", io.StringIO("/quit\n"))
    models = ["--model", str(tiny_models["llama"].gguf_path), "--draft-model", str(tiny_models["qwen3"].gguf_path)]
    lines = []
    for command in (["serve", "--port", "0", "--context", "256"], ["generate", "--prompt", "hi", "--max-tokens", "1"],
                    ["chat"]):
        assert main(["--data-dir", str(tmp_path), *command, *models]) == 0, command
        lines.append([line for line in capsys.readouterr().err.splitlines() if "cannot draft for" in line])
    assert lines[0] == lines[1] == lines[2] and len(lines[0]) == 1 and lines[0][0].startswith("parley: "), lines
