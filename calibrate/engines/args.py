"""Which of a user's ``[server] args`` calibrate refuses, per engine kind: the flags each kind's
builder writes itself (the cap, the port, the model, the served name; llama.cpp's -c and
--threads-http), by every spelling the engine takes. Imports nothing of calibrate: both the
config check (``calibrate.config``) and the builders (``calibrate.engines.builders``) read it.
"""

from __future__ import annotations

from typing import Literal

# The engine kinds calibrate knows how to start, pin and read.
ServerKind = Literal["vllm", "llamacpp", "sglang", "lmdeploy", "ollama", "tgi", "custom"]

MAX_ARGS = 64  # entries in [server] args

# Why calibrate owns a flag, and where its value is set instead (the refusal's message).
_CAP = "calibrate sets from the batch size: remove it; the ladder finds it"
_PORT = "calibrate sets from [server] port: remove it and set the port there"
_MODEL = "calibrate sets from [server] model_path: remove it and set the path there"
_NAME = "calibrate sets from [target] model (the name clients send): remove it and set it there"
_CTX = (
    "calibrate sizes from the slots and the verified workload: remove it; "
    "search it with calibrate tune --grid ctx_size=V1,V2"
)
_THREADS = "calibrate sets from the most requests in flight + 2: remove it"
#: the flags each kind's builder writes itself, by every spelling the engine takes
OWN_FLAGS: dict[str, dict[str, str]] = {
    "vllm": {
        "--max-num-seqs": _CAP,
        "--port": _PORT,
        "--model": _MODEL,
        "--served-model-name": _NAME,
    },
    "llamacpp": {
        "--parallel": _CAP,
        "-np": _CAP,
        "--port": _PORT,
        "-m": _MODEL,
        "--model": _MODEL,
        "--alias": _NAME,
        "-a": _NAME,
        "-c": _CTX,
        "--ctx-size": _CTX,
        "--threads-http": _THREADS,  # builders.LLAMACPP_THREADS_HTTP
    },
    "sglang": {
        "--max-running-requests": _CAP,
        "--port": _PORT,
        "--model-path": _MODEL,
        "--model": _MODEL,
        "--served-model-name": _NAME,
    },
    "lmdeploy": {
        "--max-batch-size": _CAP,
        "--server-port": _PORT,
        "--model-name": _NAME,
    },
    "tgi": {
        "--max-concurrent-requests": _CAP,
        "--port": _PORT,
        "--model-id": _MODEL,
    },
}


def flag_name(word: str) -> str | None:
    """``--max_num_seqs=8`` → ``--max-num-seqs``; None for a word that is not a flag."""
    if not word.startswith("-") or word == "-" or word[1:2].isdigit():
        return None  # a value: "-", "-1", "-0.5"
    name = word.split("=", 1)[0]
    dashes = len(name) - len(name.lstrip("-"))
    return name[:dashes] + name[dashes:].replace("_", "-")


def args_problem(kind: str | None, args: tuple[str, ...]) -> str:
    """Why ``[server] args`` cannot be used with ``kind`` ("" when it can)."""
    bad = next((a for a in args if "\0" in a or "\n" in a or "\r" in a), None)
    if bad is not None:
        return f"args entry {bad!r} holds a NUL or a line break: give one argument per entry"
    if len(args) > MAX_ARGS:
        return f"args has {len(args)} entries; at most {MAX_ARGS} are allowed"
    if not args or kind is None:
        return ""
    if kind == "ollama":
        return (
            'args is not used with kind = "ollama": ollama serve takes no engine flags '
            "(set OLLAMA_* variables in the environment calibrate runs in; it passes them on): "
            "remove args"
        )
    if kind == "custom":
        return 'args is not used with kind = "custom": put the flags in [server] command'
    own = OWN_FLAGS.get(kind, {})
    for word in args:
        name = flag_name(word)
        if name is not None and name in own:
            return f"args sets {name}, which {own[name]}"
    return ""
