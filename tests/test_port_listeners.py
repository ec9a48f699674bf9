"""Who listens on a port (SPEC §5.14, rollback's stop command): found through the socket, never
by name, by one search (``gpu.proc.listening_owners``) — over a /proc written to a folder here,
and over this machine's real sockets on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from calibrate.config import Config
from calibrate.gpu import sockdiag
from calibrate.gpu.proc import LinuxProc, listening_owners, socket_inodes
from calibrate.server.pids import listener_pid
from calibrate.stages.measure.tier_run import server_finder
from tests.stage_fakes import close_runs, stage_ctx

__all__ = ["close_runs"]  # the autouse fixture, used by being imported

HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout"
    " inode\n"
)


def fake_proc(root: Path, sockets: dict[int, list[str]], listening: dict[int, int]) -> Path:
    """A /proc of processes holding ``sockets`` (pid → their fd links), and a socket table of
    ``listening`` (inode → port, each in state LISTEN)."""
    (root / "net").mkdir(parents=True)
    rows = "".join(
        f"   {n}: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000"
        f"  0 0 {inode}\n"
        for n, (inode, port) in enumerate(listening.items())
    )
    (root / "net" / "tcp").write_text(HEADER + rows)
    for pid, links in sockets.items():
        fd = root / str(pid) / "fd"
        fd.mkdir(parents=True)
        for n, link in enumerate(links, 3):
            if link:
                (fd / str(n)).symlink_to(link)
            else:  # an fd that cannot be read as a link (closed while it was looked at)
                (fd / str(n)).write_text("")
    return root


def test_the_stop_command_and_the_self_check_find_the_same_listener(tmp_path: Path) -> None:
    """Rollback's stop command had a search of its own: a process with one fd it could not read
    (closed while it looked) was passed over, so a server was "unknown" to it and found by the
    self-check. Now one search: the lowest PID of those holding the socket."""
    root = fake_proc(
        tmp_path / "proc",
        {7: ["/dev/null"], 42: ["socket:[777]", ""], 43: ["socket:[777]"], 44: ["socket:[9]"]},
        {777: 8080, 9: 8081},
    )
    assert listening_owners(8080, root) == {42, 43}  # a server and its forked worker
    assert listener_pid(8080, root) == 42
    assert listener_pid(8082, root) is None and listening_owners(8082, root) == set()
    assert listener_pid(8080, tmp_path / "none") is None  # no /proc: not known


def test_a_real_listener_on_this_machine_is_this_process() -> None:
    """The old copy never found its own process: the listing of /proc/self/fd holds the
    listing's own descriptor, closed by the time its link is read, and one unreadable link
    dropped the whole process."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert listening_owners(port) == {os.getpid()}
        assert listener_pid(port) == os.getpid()
    assert listener_pid(port) is None


def _sock_diag() -> None:
    if sockdiag.listening_inodes(1) is None:
        pytest.skip("sock_diag (netlink) is refused here")


def test_sock_diag_finds_the_sockets_the_socket_table_lists() -> None:
    """Only listening sockets, of the port asked about, IPv4 and IPv6 alike: the table's."""
    _sock_diag()
    with contextlib.ExitStack() as held:
        four = held.enter_context(socket.socket())
        four.bind(("127.0.0.1", 0))
        four.listen()
        port = four.getsockname()[1]
        client = held.enter_context(socket.create_connection(("127.0.0.1", port)))
        held.enter_context(four.accept()[0])
        assert sockdiag.listening_inodes(port) == socket_inodes(port) == {_inode(four)}
        assert sockdiag.listening_inodes(client.getsockname()[1]) == set()  # connected only
        if socket.has_ipv6:
            with contextlib.suppress(OSError):  # no IPv6 on this machine: the IPv4 half stands
                six = held.enter_context(socket.socket(socket.AF_INET6))
                six.bind(("::1", port))
                six.listen()
                assert sockdiag.listening_inodes(port) == {_inode(four), _inode(six)}
                assert socket_inodes(port) == {_inode(four), _inode(six)}
    assert sockdiag.listening_inodes(port) == set()


def test_where_netlink_is_refused_the_socket_table_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(*args: object) -> socket.socket:
        raise PermissionError(1, "Operation not permitted")

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        monkeypatch.setattr(socket, "socket", refused)  # a sandbox without netlink
        assert sockdiag.listening_inodes(port) is None
        assert listening_owners(port) == {os.getpid()}
        assert LinuxProc().listening(port) == [os.getpid()]


def test_what_was_found_is_kept_while_its_process_lives_without_rereading_the_table(
    tmp_path: Path,
) -> None:
    """Where sock_diag cannot answer (here: a /proc in a folder) the re-check is the old rule:
    the process lives. The socket table, thousands of lines on a busy machine, is not read."""
    root = fake_proc(tmp_path / "proc", {42: ["socket:[777]"]}, {777: 8080})
    proc = LinuxProc(root)
    assert proc.listening(8080) == [42]
    (root / "net" / "tcp").unlink()
    assert proc.listening(8080) == [42]
    shutil.rmtree(root / "42")  # gone: looked for again, and not found
    assert proc.listening(8080) == []


LISTENER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print(s.getsockname()[1], flush=True)
sys.stdin.readline()  # a line: stop listening, and live on until stdin closes
s.close()
print("closed", flush=True)
sys.stdin.read()
"""


def _listener(port: int) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LISTENER, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_a_restarted_server_is_found_while_its_old_process_lives_on(tmp_path: Path) -> None:
    """The self-check kept the first listener's PID while that process lived: a server
    restarted on the same port by a supervisor that lives on (or an old process that closed its
    socket and lingers) left its new processes counted as "other processes" by the noise meter.
    Now the listening socket itself is re-checked (sock_diag) and the new process found."""
    _sock_diag()
    old, port = _listener(0)
    new: subprocess.Popen[str] | None = None
    try:
        cfg = replace(
            Config(), target=replace(Config().target, base_url=f"http://127.0.0.1:{port}/v1")
        )
        pids = server_finder(None, stage_ctx(tmp_path, cfg, "ladder"), LinuxProc())
        assert pids() == [old.pid] and pids() == [old.pid]
        assert old.stdin is not None and old.stdout is not None
        old.stdin.write("close\n")
        old.stdin.flush()
        assert old.stdout.readline() == "closed\n"
        new, _ = _listener(port)
        assert pids() == [new.pid] and old.poll() is None
    finally:
        for proc in (old, new):
            if proc is not None:
                proc.kill()
                proc.communicate()  # reaped, its pipes closed


def _inode(sock: socket.socket) -> int:
    return os.stat(f"/proc/self/fd/{sock.fileno()}").st_ino
