"""A managed engine whose listening socket outlives its PID by ``--linger-s``: a forked child
holds it, as a killed engine's last threads do for a few ms after /proc calls it a zombie.

    python tests/fakes/lingering_engine.py --port P [--linger-s 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODELS = json.dumps({"object": "list", "data": [{"id": "internlm-s2", "object": "model"}]})
# what a managed start's first 1-token completion gets (ready means ready, SPEC §6)
ANSWER = json.dumps(
    {
        "object": "text_completion",
        "model": "internlm-s2",
        "choices": [{"index": 0, "text": "Hi", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # /health, /v1/models: everything a readiness probe asks
        body = MODELS.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # the one completion a managed start asks for
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = ANSWER.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--linger-s", type=float, default=1.0)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _Handler)
    parent = os.getpid()
    if os.fork() == 0:  # the child: keeps the inherited listening socket until after the parent
        while os.getppid() == parent:
            time.sleep(0.01)
        time.sleep(args.linger_s)
        os._exit(0)
    print(f"lingering engine listening on http://127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
