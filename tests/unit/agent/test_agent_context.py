"""Reading what one request may use from an engine's own answer (agent.context), and
finding llama.cpp's server (agent.binaries)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import binaries, context
from agent.engines import Launch, UnknownEngine, command

# /props of llama-server (trimmed): --ctx-size 2048 --parallel 4 on the tiny test model.
PROPS: dict[str, Any] = {
    "default_generation_settings": {"n_ctx": 512, "params": {"n_predict": -1}},
    "total_slots": 4,
    "model_path": "/tmp/tiny.gguf",
    "chat_template": "{% for m in messages %}...{% endfor %}",
}


ARGV = ("llama-server", "-m", "/m.gguf", "--ctx-size", "4096", "--ctx-size", "2048", "-np", "4")


def test_llamacpp_divides_its_context_across_slots_and_says_so() -> None:
    found = context.from_llamacpp_props(PROPS, ARGV)
    assert found == context.EngineContext(512, "--ctx-size 2048 / --parallel 4 = 512")
    one = context.from_llamacpp_props({**PROPS, "total_slots": 1}, ["-c", "512"])
    assert one == context.EngineContext(512, "--ctx-size 512 / --parallel 1 = 512")


def test_a_unified_cache_or_an_unknown_command_line_is_said_as_props_says_it() -> None:
    # --parallel not given: llama-server unifies the KV cache, each slot may use it all.
    unified = {**PROPS, "default_generation_settings": {"n_ctx": 4096}}
    assert context.from_llamacpp_props(unified, ["llama-server", "-c", "4096"]) == (
        context.EngineContext(4096, "n_ctx 4096 a slot, 4 slot(s) (/props)")
    )
    found = context.from_llamacpp_props(PROPS)
    assert found is not None and found.detail == "n_ctx 512 a slot, 4 slot(s) (/props)"


def test_vllm_lists_max_model_len_with_the_served_model() -> None:
    models = {"data": [{"id": "other", "max_model_len": 4}, {"id": "m", "max_model_len": 8192}]}
    assert context.from_models_list(models, "m") == context.EngineContext(
        8192, "max_model_len 8192"
    )
    assert context.from_models_list(models, "absent") is None
    assert context.from_models_list({"data": [{"id": "m"}]}, "m") is None


@pytest.mark.parametrize(
    "props",
    [
        None,
        [],
        {},
        {"default_generation_settings": None},
        {"default_generation_settings": {"n_ctx": "512"}},
        {"default_generation_settings": {"n_ctx": 0}},
        {"default_generation_settings": {"n_ctx": True}},
        {"default_generation_settings": {"n_ctx": 1 << 40}},
    ],
)
def test_an_answer_of_the_wrong_shape_means_not_known(props: Any) -> None:
    assert context.from_llamacpp_props(props) is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "n_ctx",
                    "default_generation_settings",
                    "total_slots",
                    "data",
                    "id",
                    "max_model_len",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@given(JSON)
def test_no_answer_breaks_the_parsers_or_yields_a_bad_figure(body: Any) -> None:
    for engine in ("llamacpp", "vllm", "sim", "other"):
        found = context.parse(engine, body, "m")
        assert found is None or 1 <= found.tokens <= context.MAX_TOKENS


def test_a_ready_engine_is_asked_over_http(tmp_path: Path) -> None:
    # A real HTTP server answering what llama-server answers; the body is bounded.
    import http.server
    import threading

    bodies = {"/props": json.dumps(PROPS).encode(), "/v1/models": b"x" * (context.MAX_BODY + 2)}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = bodies.get(self.path, b"{}")
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert context.read("llamacpp", base, "m", argv=ARGV) == context.EngineContext(
            512, "--ctx-size 2048 / --parallel 4 = 512"
        )
        assert context.read("vllm", base, "m") is None  # too large to be an answer
        assert context.read("other", base, "m") is None  # not asked at all
    finally:
        server.shutdown()
    assert context.read("llamacpp", base, "m", timeout=0.5) is None  # nobody listens


def _executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_server_is_found_by_setting_then_path_then_package(tmp_path: Path) -> None:
    named = _executable(tmp_path / "my-llama-server")
    assert binaries.find_llamacpp_server(str(named), path="") == (str(named), "setting")
    assert binaries.find_llamacpp_server(str(tmp_path / "absent"), path="") == (None, "setting")
    on_path = tmp_path / "bin"
    on_path.mkdir()
    _executable(on_path / "llama-server")
    found = binaries.find_llamacpp_server(None, path=str(on_path))
    assert found == (str(on_path / "llama-server"), "PATH")
    packaged = binaries.package_server()
    expected = (str(packaged), "package") if packaged is not None else (None, "none")
    assert binaries.find_llamacpp_server(None, path=str(tmp_path / "empty")) == expected


def test_the_found_server_is_what_the_agent_runs_and_its_absence_is_a_refusal() -> None:
    gguf = Launch(engine="llamacpp", profile="cpu", model_path="/m.gguf", served_model_name="m")
    cmd = command(gguf, host="h", port=1, devices=[], llamacpp_server="/opt/bin/llama-server")
    assert cmd.argv[:3] == ("/opt/bin/llama-server", "-m", "/m.gguf")
    with pytest.raises(
        UnknownEngine,
        match=r"'m' profile 'cpu': llama\.cpp's llama-server was "
        r"not found on this node.*make llamacpp.*\[agent\] llamacpp_server",
    ):
        command(gguf, host="h", port=1, devices=[], llamacpp_server=None)
    assert os.sep in cmd.argv[0]


def test_the_engines_key_does_not_follow_a_redirect_to_another_host() -> None:
    # Attack: whatever answers on a keyed engine's address (the port taken by another
    # process after the engine exited; an endpoint a control plane was told) answers
    # 302 to a host of its choosing: urllib followed it with every header, the key
    # (agent.context.read, asked with the engine's key) and engine-check's key or
    # gateway token (engine_check.probe.post) included.
    import http.server
    import threading

    from engine_check.probe import Target, post

    seen: list[str | None] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            body = json.dumps(PROPS).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    elsewhere = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    target = f"http://localhost:{elsewhere.server_address[1]}"

    class Redirects(http.server.BaseHTTPRequestHandler):
        def _away(self) -> None:
            self.send_response(302)
            self.send_header("Location", target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _away

        def log_message(self, *args: Any) -> None:
            pass

    redirects = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirects)
    for server in (elsewhere, redirects):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{redirects.server_address[1]}"
        context.read("llamacpp", base, "m", argv=ARGV, key="sk-engine-key")
        post(
            Target(base, "m", "replica", headers={"Authorization": "Bearer sk-engine-key"}),
            "/v1/embeddings",
            {"model": "m", "input": "x"},
            timeout=5.0,
        )
    finally:
        for server in (elsewhere, redirects):
            server.shutdown()
            server.server_close()
    assert seen, "the redirects were not followed at all: the test proves nothing"
    assert seen == [None] * len(seen), seen


def _dripping_engine(head: bytes) -> tuple[str, Any]:
    """A server on the engine's address that sends ``head`` and then one byte every 0.2 s
    for ever, each within any per-read timeout; (its URL, its closer)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            try:
                conn.sendall(head)
                while not stop.wait(0.2):
                    conn.sendall(b"x")
            except OSError:
                pass  # the reader gave up

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()

    def close() -> None:
        stop.set()
        listener.close()

    return f"http://127.0.0.1:{listener.getsockname()[1]}", close


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2000000\r\n\r\n",  # the body dripped
        b"HTTP/1.1 200 OK\r\nx-slow: ",  # a header dripped (65,536 bytes a line)
    ],
    ids=["body", "header"],
)
def test_an_engine_dripping_its_answer_holds_the_agents_loop_no_longer_than_the_timeout(
    head: bytes,
) -> None:
    """Attack: whatever answers on an engine's port (the engine runs code that came with
    its model) sends a byte just within each read's timeout: the health check (1 s a
    read, 1,024 bytes) and the context read (2 s a read, 1 MB) each held the agent's
    loop for minutes to weeks, its reports with it, and the node was given up. Each
    ask now ends by its timeout, whatever the engine sends."""
    import threading
    import time

    from agent import processes

    url, close = _dripping_engine(head)
    try:
        for ask, timeout in (
            (lambda: processes.healthy(url + "/health", timeout=1.0), 1.0),
            (lambda: context.read("llamacpp", url, "m", timeout=2.0), 2.0),
        ):
            took: list[float] = []

            def timed(ask: Any = ask, took: list[float] = took) -> None:
                started = time.monotonic()
                assert not ask()
                took.append(time.monotonic() - started)

            thread = threading.Thread(target=timed, daemon=True)
            thread.start()
            thread.join(timeout + 8)
            assert took, f"still reading {timeout + 8} s later"
            assert took[0] < timeout + 1.5, took
    finally:
        close()


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0-OpenSSH_9.6\r\n",  # another service on the port: BadStatusLine
        b"HTTP/1.1 200 OK\r\nx: " + b"y" * 70_000 + b"\r\n\r\n",  # LineTooLong
        b"HTTP/1.1 200 OK\r\n" + b"x: y\r\n" * 200 + b"\r\n",  # more than 100 headers
    ],
    ids=["not-http", "long-header", "many-headers"],
)
def test_an_engine_answering_what_is_no_http_is_not_ready_and_breaks_nothing(
    answer: bytes,
) -> None:
    """Attack: whatever answers on an engine's port answers what http.client refuses
    (an HTTPException, neither an OSError nor a ValueError): the health check raised
    out of the agent's observe(), the first step of its tick, and every tick failed
    before its report while the engine answered so: one engine took its node down."""
    import socket
    import threading

    from agent import processes
    from engine_check import probe

    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        assert processes.healthy(url + "/health") is False
        assert context.read("llamacpp", url, "m") is None
        # engine-check: a verdict naming the failure, not a traceback quoting the answer.
        target = probe.Target(base_url=url, model="m", via="replica", headers={})
        assert probe.post(target, "/v1/chat/completions", {}, timeout=5).status is None
    finally:
        listener.close()


def test_a_bounded_opener_asked_without_a_timeout_of_its_own_takes_its_bound() -> None:
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        with context.direct_opener(within=2).open(url) as answer:  # urllib's default timeout
            assert answer.read() == b"ok"
    finally:
        server.shutdown()
