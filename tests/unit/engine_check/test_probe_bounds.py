"""engine-check's requests against an engine that answers too slowly to ever finish."""

from __future__ import annotations

import socket
import threading
import time

from engine_check.probe import Target, post


def test_an_engine_dripping_its_answer_is_given_up_on_within_the_timeout() -> None:
    # Attack: an engine (or anything listening on its port) sends its head, then a byte
    # of body every 0.2 s. Each read then finishes well within a per-read timeout, and
    # engine-check waited on it for as long as the engine kept dripping (forever).
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
            ends = time.monotonic() + 8  # a regression fails the test rather than hang it
            while not stop.wait(0.2) and time.monotonic() < ends:
                try:
                    conn.sendall(b" ")
                except OSError:
                    return

    threading.Thread(target=drip, daemon=True).start()
    port = listener.getsockname()[1]
    try:
        started = time.monotonic()
        said = post(Target(f"http://127.0.0.1:{port}", "m", "r"), "/v1/chat/completions", {}, 1.0)
        took = time.monotonic() - started
    finally:
        stop.set()
        listener.close()
    assert took < 4, f"engine-check waited {took:.1f} s on a dripping answer (timeout 1 s)"
    assert said.status is None and said.body is None, said
    assert "timed out" in said.text or "longer than its time" in said.text, said.text
