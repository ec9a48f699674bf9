"""Ready means ready (SPEC §6, issue 37): a managed engine is ready when its own process is
alive, holds the listening socket and has answered one real 1-token completion.

Seen on real vLLM: with a tiny model of head size 16 it answered ``/health`` and ``/v1/models``
with 200, then died on the first completion ("Unsupported CPU attention configuration:
head_dim=16"); and ``server start`` said "server ready on port 9140" when a stranger had taken
the port while the engine loaded and the engine itself had exited "Address already in use" —
the next ``single`` wrote a baseline from the stranger.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from calibrate.errors import ServerDied, ServerUnreachable
from calibrate.server import lifecycle as server
from calibrate.server import process, readiness
from tests.fakes import free_port, managed_config, mock_command, pid_gone
from tests.mockserver import start_mock

DIES_ON_FIRST_COMPLETION = """
import http.server, json, os, sys
port = int(sys.argv[1])
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # /health and /v1/models: 200, as vLLM's were
        self.send_response(200); self.send_header("Content-Length", str(len(MODELS)))
        self.end_headers(); self.wfile.write(MODELS)
    def do_POST(self):
        print("RuntimeError: Unsupported CPU attention configuration: head_dim=16", flush=True)
        os._exit(3)
    def log_message(self, *a): pass
print("engine listening", flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""

# loads for a while, then finds its port taken and exits, as vLLM did
LOADS_THEN_FINDS_THE_PORT_TAKEN = """
import socket, sys, time
time.sleep(float(sys.argv[2]))
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError as exc:
    print(f"ERROR: [Errno 98] error while attempting to bind: Address already in use ({exc})", flush=True)
    sys.exit(1)
"""


def _start(tmp_path: Path, source: str, port: int, *args: str) -> server.Started:
    script = tmp_path / "engine.py"
    script.write_text(source, encoding="utf-8")
    return server.start(
        tmp_path / "runs",
        [sys.executable, str(script), str(port), *args],
        kind="vllm",
        port=port,
        health_path="/health",
        ready_timeout_s=20,
        stop_timeout_s=2,
    )


def test_an_engine_that_dies_on_its_first_completion_is_exit_4_with_its_log(
    tmp_path: Path,
) -> None:
    port = free_port()
    with pytest.raises(ServerDied) as died:
        _start(tmp_path, DIES_ON_FIRST_COMPLETION, port)
    message = died.value.message
    assert died.value.server_exit_code == 3 and died.value.exit_code == 4
    assert "exited with code 3 before it was ready" in message
    assert "it failed its first 1-token completion" in message or "then it exited" in message
    assert "Unsupported CPU attention configuration: head_dim=16" in message, "the log tail"
    assert process.load(tmp_path / "runs") is None, "no managed server is left on record"


def test_a_stranger_on_the_port_while_the_engine_loads_is_never_ready(tmp_path: Path) -> None:
    """The port was free at the start; a stranger takes it while the engine loads and answers
    /health at once. The start is exit 4 naming the stranger, never "server ready"."""
    port = free_port()
    outcome: list[BaseException | server.Started] = []

    def start() -> None:
        try:
            outcome.append(_start(tmp_path, LOADS_THEN_FINDS_THE_PORT_TAKEN, port, "3"))
        except BaseException as exc:  # the test reads it below
            outcome.append(exc)

    starting = threading.Thread(target=start)
    starting.start()
    deadline = time.monotonic() + 10
    while process.load(tmp_path / "runs") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    engine = process.load(tmp_path / "runs")
    assert engine is not None, "the engine was spawned and recorded"
    with start_mock(port=port):  # the stranger: answers /health, /v1/models, completions
        starting.join(30)
    assert not starting.is_alive()
    found = outcome[0]
    assert isinstance(found, ServerUnreachable), found
    message = found.message
    assert f"port {port} is answered by another process" in message or "exited" in message
    assert "server ready" not in message
    assert pid_gone(engine.pid), "calibrate's own engine is stopped"
    assert process.load(tmp_path / "runs") is None


def test_the_engine_holding_its_own_socket_is_told_from_a_stranger(tmp_path: Path) -> None:
    """The socket table says who listens: the test's own mock is no engine of another session."""
    import os

    with start_mock() as mock:
        owners = readiness.listening_owners(mock.port)
        if owners is None:
            pytest.skip("no /proc socket table here")
        assert os.getpid() in owners
        assert readiness.stranger_on_port(mock.port, engine_pid=os.getpid() + 10**6) is not None
        assert readiness.stranger_on_port(mock.port, engine_pid=os.getsid(0)) is None


def _completions_received(port: int) -> int:
    """What the managed mock counts in ``mock_requests_total``: completions it was sent."""
    import requests

    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("mock_requests_total{")
    )


@pytest.mark.usefixtures("repo_on_pythonpath")
def test_a_first_completion_slower_than_a_probe_limit_is_waited_for_never_sent_again(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold engine's first token can take minutes. Readiness gave each 1-token completion
    120 s, then sent another while the engine still worked on the first: the probes piled up
    in its queue (here the limit cut to 0.8 s against the mock's 2.5 s first token: never
    ready within 15 s, exit 4, the mock sent a completion every second). One probe is in flight
    at a time, waited for within the start's own deadline; a slow one says what it waits on."""
    monkeypatch.setattr(readiness, "COMPLETION_TIMEOUT_S", 0.8, raising=False)  # the old limit
    monkeypatch.setattr(readiness, "SAY_WAITING_S", 0.5, raising=False)
    port = free_port()
    managed_config(isolated, port, mock_command("--ttft", "2.5"), ready_timeout_s=15)
    result = cli("server", "start", "--concurrency", "1")
    assert result.code == 0, result.err
    assert _completions_received(port) == 1, "one 1-token completion, waited for"
    assert "waiting for the engine's first 1-token completion" in result.err + result.out
    assert "to the start's deadline ([server] ready_timeout_s 15)" in result.err + result.out
    assert cli("server", "stop").code == 0
