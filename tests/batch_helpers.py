"""Helpers shared by the batch tests: tasks files, reading results, the CLI as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calibrate.http.client import OpenAIClient
from calibrate.load.request import Request
from calibrate.load.transport import Exchange
from calibrate.stages.batch.sending.lanes import Lane, make_lane
from calibrate.stages.batch.sending.outage import OutagePolicy
from calibrate.state.setting import Endpoint
from tests.mockserver import REPO


def write_tasks(path: Path, n: int, *, prompt_of: Any = None, start: int = 0) -> Path:
    """``n`` tasks with ids t<start>…; ``prompt_of(i)`` may give an item its own prompt."""
    with path.open("w", encoding="utf-8") as handle:
        for i in range(start, start + n):
            item: dict[str, Any] = {"id": f"t{i}", "text": f"第{i}段：定长数组的长度在编译时确定。"}
            if prompt_of is not None and (p := prompt_of(i)) is not None:
                item["prompt"] = p
            handle.write(json.dumps(item, ensure_ascii=False) + "\n")
    return path


def results(path: Path) -> list[dict[str, Any]]:
    """Every parseable line of an output file (torn ones skipped)."""
    out = []
    for line in path.read_text("utf-8", errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def ok_ids(path: Path) -> list[Any]:
    return [r["id"] for r in results(path) if r["ok"]]


def batch_process(cwd: Path, *args: str) -> subprocess.Popen[str]:
    """``python -m calibrate batch ARGS`` in ``cwd``; stderr captured as text."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen(
        [sys.executable, "-m", "calibrate", "batch", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen[str], timeout_s: float = 20) -> int:
    """Wait until ``path`` has at least ``n`` lines (the process still running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        count = path.read_bytes().count(b"\n") if path.exists() else 0
        if count >= n:
            return count
        if proc.poll() is not None:
            raise AssertionError(f"batch ended early ({proc.returncode}): {proc.communicate()}")
        time.sleep(0.01)
    raise AssertionError(f"{path} did not reach {n} lines in {timeout_s} s")


class Reply:
    """What the hostile server does with one request: a status and raw body, or a dropped line."""

    def __init__(
        self, body: bytes = b"", status: int = 200, *, drop: bool = False, header_drip_s: float = 0
    ) -> None:
        self.body, self.status, self.drop = body, status, drop
        self.header_drip_s = header_drip_s  # > 0: the status line and headers a byte at a time


def completion(content: str | None, finish_reason: str = "stop") -> Reply:
    """A well-formed chat completion; ``content`` is put into the JSON as given (escapes too)."""
    message = "null" if content is None else json.dumps(content)
    return raw_completion(
        f'[{{"index":0,"message":{{"role":"assistant","content":{message}}},'
        f'"finish_reason":"{finish_reason}"}}]'
    )


def raw_completion(choices_json: str) -> Reply:
    """A completion whose ``choices`` is the raw JSON text given (malformed on purpose)."""
    return Reply(
        b'{"id":"x","object":"chat.completion","model":"internlm-s2","choices":'
        + choices_json.encode("utf-8", "surrogatepass")
        + b',"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
    )


class HostileServer:
    """A purpose-built HTTP server: ``reply(item_text) -> Reply`` decides every answer."""

    def __init__(self, reply: Any) -> None:
        import http.server

        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # /v1/models, /health, /metrics
                self._send(Reply(b'{"object":"list","data":[{"id":"internlm-s2"}]}'))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                text = body["messages"][-1]["content"] if "messages" in body else ""
                with owner.lock:
                    owner.requests += 1
                self._send(owner.reply(text))

            def _send(self, reply: Reply) -> None:
                if reply.drop:
                    self.connection.shutdown(2)  # the line drops mid-request: a reset
                    return
                if reply.header_drip_s:
                    self._drip_headers(reply)
                    return
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def _drip_headers(self, reply: Reply) -> None:
                import time

                head = (
                    f"HTTP/1.0 {reply.status} OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(reply.body)}\r\n\r\n"
                ).encode()
                try:
                    for byte in head:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(reply.header_drip_s)
                    self.wfile.write(reply.body)
                except OSError:  # the client gave up at its deadline
                    self.close_connection = True

        self.reply = reply
        self.lock = threading.Lock()
        self.requests = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(  # a short poll: shutdown() waits for the next one
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class ScriptedTransport:
    """A ``Transport`` answering in this process (no HTTP): ``answer(body)`` gives the item's
    completion (or raises its failure), after ``delay_s`` on the loop, as a socket wait would."""

    base_url = "http://scripted.invalid/v1"
    timeout_s = 30.0

    def __init__(self, answer: Callable[[dict[str, Any]], Any], delay_s: float = 0.001) -> None:
        self.answer = answer
        self.delay_s = delay_s
        self.calls = 0

    async def send(self, request: Request) -> Exchange:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        return Exchange(self.answer(request.body))


def scripted_lane(transport: ScriptedTransport, concurrency: int) -> Lane:
    """One endpoint's lane over ``transport``; its probe (never asked while answers come) would
    go to a host that does not exist."""
    client = OpenAIClient(transport.base_url, timeout_s=transport.timeout_s)
    endpoint = Endpoint(transport.base_url, concurrency, "spec")
    return make_lane(endpoint, client, OutagePolicy(), transport=transport)


def assert_valid_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line of ``path`` is strict UTF-8 and strict JSON (no NaN); returns the records."""

    def no_constants(name: str) -> Any:
        raise AssertionError(f"{path} holds {name}")

    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "the file ends mid-line"
    return [
        json.loads(line.decode("utf-8"), parse_constant=no_constants)
        for line in data.split(b"\n")[:-1]
    ]


def assert_each_item_once(out: Path, n: int) -> None:
    """``out`` is valid JSONL with one ok line for each of the ``n`` items t0… and no more."""
    counts = Counter(ok_ids(out))
    assert set(counts) == {f"t{i}" for i in range(n)}, "an item was lost"
    assert set(counts.values()) == {1}, "an item was written twice"
    assert_valid_jsonl(out)
