"""Who listens on a port (SPEC §5.14, rollback's stop command): found through the socket, never
by name, by one search (``gpu.proc.listening_owners``) — over a /proc written to a folder here,
and over this machine's real sockets on 127.0.0.1."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from calibrate.gpu.proc import listening_owners
from calibrate.server.pids import listener_pid

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


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
