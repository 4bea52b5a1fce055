"""Server under load: N streaming chats keep their pace while 50 clients hang up and a 100 MB body arrives.

    .venv/bin/python bench/server_load.py [--model PATH] [--device auto|cpu|cuda] [--streams 64] [--tokens 128]
                                          [--leavers 50] [--huge-mb 100] [--huge-declared] [--max-sessions N]
                                          [--speculative auto|off|lookup] [--max-body-mb 8] [--data-dir DIR]
    e.g. on a laptop CPU: --streams 4 --tokens 40 --leavers 10 --huge-mb 20

A real `parley serve` (uvicorn on a background thread, ServerBridge, the embedded Gemma 3 270M unless --model) runs
in this process. Phase "normal": N streams at once; phase "attack": the same N streams and, once each has its
first tokens, `--leavers` clients that POST then hang up after 0.1 s, plus one `--huge-mb` upload streamed in
1 MB chunks (chunked, or with its Content-Length with --huge-declared), which the body limit should refuse (413).
Gaps are client-side arrival times of SSE content chunks, after each stream's first 3. EOS is banned and "stop"
never matches, so every stream makes all its tokens. A verify step (--speculative; "auto" is lookup) hands
several tokens of a stream over at once: near-zero gaps, then a long one (drafting stops while more than 2 chats
decode, so at the default 64 streams it stays out of the way). RSS is this whole process's (server,
engine and the client threads).
Prints one JSON line, then a summary; exits 0 whatever the figures ("pass": p99 ratio < 2 and the upload got 413).
"""
from __future__ import annotations

import argparse
import json
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.backend import resolve_device  # noqa: E402
from engine.loading.default_model import default_model_path  # noqa: E402
from engine.runtime import EngineConfig  # noqa: E402
from server.app import DISCONNECT_POLL_S, ServerSettings  # noqa: E402
from server.bridge import ServerBridge  # noqa: E402
from server.run import BackgroundServer  # noqa: E402

NEVER = ["never \u2603"]
SKIP = 3  # first content chunks of a stream (prefill, joining the batch) not counted


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def stats_ms(gaps: list[float]) -> dict:
    g = sorted(gaps) or [float("nan")]
    p99 = g[min(len(g) - 1, int(len(g) * 0.99))]
    return {"n": len(gaps), "p50_ms": round(statistics.median(g) * 1e3, 2), "p99_ms": round(p99 * 1e3, 2),
            "max_ms": round(g[-1] * 1e3, 2)}


def stream(url: str, body: dict, out: dict, warm: threading.Semaphore) -> None:
    """One streaming chat: arrival time of each content chunk and the usage it reports."""
    stamps, usage = [], None
    try:
        with httpx.stream("POST", url + "/chat/completions", json=body, timeout=120) as r:  # a stall is an error
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                    stamps.append(time.perf_counter())
                    if len(stamps) == SKIP:
                        warm.release()
                usage = chunk.get("usage") or usage
    except Exception as exc:  # noqa: BLE001 -- reported, not raised: one failed stream is a finding
        out["error"] = repr(exc)
    if len(stamps) < SKIP:
        warm.release()
    out.update(stamps=stamps, tokens=(usage or {}).get("completion_tokens", len(stamps)))


def post_and_hang_up(port: int, body: dict, after: float) -> None:
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        time.sleep(after)


def huge_request(url: str, model: str, mb: int, declared: bool) -> dict:
    head, tail, chunk = (b'{"model": ' + json.dumps(model).encode() + b', "messages": [{"role": "user", "content": "',
                         b'"}]}', b"x" * (1 << 20))
    sent = [0]

    def body():
        for part in [head] + [chunk] * mb + [tail]:
            sent[0] += len(part)
            yield part

    headers = {"content-type": "application/json"} | (
        {"content-length": str(len(head) + mb * len(chunk) + len(tail))} if declared else {})
    start, res = time.perf_counter(), {"status": None, "error": None}
    try:
        r = httpx.post(url + "/chat/completions", content=body(), headers=headers, timeout=120)
        res.update(status=r.status_code, code=(r.json().get("error") or {}).get("code") if r.content else None)
    except (httpx.HTTPError, ValueError) as exc:
        res["error"] = repr(exc)  # e.g. the server answered and closed before the upload ended
    # sent_mb: what httpx wrote (it sends the whole body before it reads the answer), not what the server read
    return res | {"sent_mb": round(sent[0] / 2**20, 1), "seconds": round(time.perf_counter() - start, 2)}


def phase(srv: BackgroundServer, model: str, streams: int, tokens: int, attack: dict | None) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
            "max_tokens": tokens, "temperature": 0, "stop": NEVER, "stream": True,
            "stream_options": {"include_usage": True}}
    outs, warm = [{"stamps": [], "tokens": 0} for _ in range(streams)], threading.Semaphore(0)
    threads = [threading.Thread(target=stream, args=(srv.url, body, o, warm)) for o in outs]
    start, res = time.perf_counter(), {}
    for t in threads:
        t.start()
    if attack is not None:
        deadline = time.monotonic() + 300
        for _ in range(streams):  # every stream is decoding before the attack
            warm.acquire(timeout=max(0.0, deadline - time.monotonic()))
        peak, done = [rss_mb()], threading.Event()

        def sample():
            while not done.wait(0.01):
                peak[0] = max(peak[0], rss_mb())

        threading.Thread(target=sample, daemon=True).start()
        leave = {k: v for k, v in body.items() if k != "stream_options"} | {"max_tokens": 40, "stream": False}
        leavers = [threading.Thread(target=post_and_hang_up, args=(srv.port, leave, 0.1)) for _ in range(attack["n"])]
        t0 = time.perf_counter()
        for t in leavers:
            t.start()
        res["huge"] = huge_request(srv.url, model, attack["mb"], attack["declared"])
        for t in leavers:
            t.join(60)
        t1 = time.perf_counter()
    for t in threads:
        t.join(900)
    wall = time.perf_counter() - start
    pairs = [(a, b) for o in outs for a, b in zip(o["stamps"][SKIP - 1:], o["stamps"][SKIP:])]
    res |= {"gaps": [b - a for a, b in pairs], "errors": [o["error"] for o in outs if "error" in o],
            "tok_s": round(sum(o["tokens"] for o in outs) / wall, 1), "min_tokens": min(o["tokens"] for o in outs)}
    if attack is not None:  # window: gaps ending while the attack arrives, or before the server notices the hang-ups
        done.set()
        res |= {"rss_peak_attack_mb": round(peak[0], 1), "attack_s": round(t1 - t0, 2),
                "window_gaps": [b - a for a, b in pairs if t0 <= b <= t1 + DISCONNECT_POLL_S]}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a .gguf file or HF folder (default: the embedded Gemma 3 270M)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    ap.add_argument("--leavers", type=int, default=50)
    ap.add_argument("--huge-mb", type=int, default=100)
    ap.add_argument("--huge-declared", action="store_true", help="send the upload's Content-Length (default: chunked)")
    ap.add_argument("--max-sessions", type=int, help="sessions generating at once (default: --streams)")
    ap.add_argument("--speculative", default="auto", choices=["auto", "off", "lookup"], help="as parley serve's")
    ap.add_argument("--max-body-mb", type=float, default=8.0, help="the server's body limit (parley serve's default)")
    ap.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "parley-bench")
    a = ap.parse_args()
    sessions = a.max_sessions or a.streams
    config = EngineConfig(max_sessions=sessions, max_session_tokens=a.tokens + 128, device=a.device,
                          max_sampled_rows=max(64, sessions), cache_dir=a.data_dir / "cache", speculative=a.speculative)
    path = Path(a.model).expanduser() if a.model else default_model_path(a.data_dir / "models")
    bridge = ServerBridge(config).start()
    try:
        served = bridge.load(path, alias="bench")
        bridge.engine.loaded_model(served.model_id).tokenizer.stop_ids = frozenset()  # EOS too: full-length streams
        settings = ServerSettings(bound_host="127.0.0.1", max_body_bytes=int(a.max_body_mb * 2**20))
        with BackgroundServer(bridge, settings=settings) as srv:
            phase(srv, served.id, a.streams, min(a.tokens, 32), None)  # warm-up: batch shapes, graphs, allocator
            normal = phase(srv, served.id, a.streams, a.tokens, None)
            rss_before = rss_mb()
            attack = phase(srv, served.id, a.streams, a.tokens,
                           {"n": a.leavers, "mb": a.huge_mb, "declared": a.huge_declared})
            deadline = time.monotonic() + 15
            while (open_sessions := bridge.engine.inspect()["sessions"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            rss_after = rss_mb()
    finally:
        bridge.shutdown()  # joins the prompt workers: exiting while one still unwinds would abort the process
    n, at, win = stats_ms(normal["gaps"]), stats_ms(attack["gaps"]), stats_ms(attack["window_gaps"])
    ratio = round(at["p99_ms"] / n["p99_ms"], 3) if n["p99_ms"] else None
    huge = attack["huge"]
    row = {"bench": "server_load", "model": served.id, "device": resolve_device(a.device, "auto")[0]}
    row |= {k: getattr(a, k) for k in ("streams", "tokens", "leavers", "huge_mb", "huge_declared", "speculative")}
    row |= {"max_sessions": sessions, "normal": n, "attack": at,
            "attack_window": win, "attack_s": attack["attack_s"], "p99_ratio": ratio,
            "window_p99_ratio": round(win["p99_ms"] / n["p99_ms"], 3) if n["p99_ms"] and win["n"] else None,
            "tok_s_normal": normal["tok_s"], "tok_s_attack": attack["tok_s"],
            "min_stream_tokens": min(normal["min_tokens"], attack["min_tokens"]),
            "stream_errors": normal["errors"] + attack["errors"], "huge": huge,
            "rss_before_mb": round(rss_before, 1), "rss_after_mb": round(rss_after, 1),
            "rss_growth_mb": round(rss_after - rss_before, 1), "rss_peak_attack_mb": attack["rss_peak_attack_mb"],
            "ru_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "open_sessions_end": open_sessions}
    row["pass"] = bool(ratio is not None and ratio < 2 and huge["status"] == 413)
    print(json.dumps(row), flush=True)
    print(f"{a.streams} streams x {a.tokens} tokens on {row['device']}: gap p50/p99/max ms normal "
          f"{n['p50_ms']}/{n['p99_ms']}/{n['max_ms']}, attack {at['p50_ms']}/{at['p99_ms']}/{at['max_ms']} "
          f"(p99 x{ratio}), attack window ({attack['attack_s']} s, {win['n']} gaps) p99 {win['p99_ms']}; "
          f"{a.huge_mb} MB upload: {huge['status']} {huge.get('code') or huge['error']} "
          f"({huge['sent_mb']} MB sent, {huge['seconds']} s); "
          f"{normal['tok_s']} -> {attack['tok_s']} tok/s; {len(row['stream_errors'])} stream errors; RSS "
          f"{row['rss_before_mb']} -> {row['rss_after_mb']} MB (attack peak {row['rss_peak_attack_mb']}, ru_maxrss "
          f"{row['ru_maxrss_mb']}); open sessions {open_sessions}; pass={row['pass']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
