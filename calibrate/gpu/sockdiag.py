"""The listening TCP sockets of a port, asked of Linux's sock_diag over netlink.

``/proc/net/tcp`` is the whole socket table, written out by the kernel on every read: thousands of
lines where a busy inference box (or a test suite) holds connections or leaves them in
TIME_WAIT, 130 ms of CPU at 5,000 connections. ``NETLINK_SOCK_DIAG`` with a state filter of
LISTEN returns only the listening sockets: tens of them, tens of microseconds. Where netlink is
refused (no Linux, a sandbox without it) ``listening_inodes`` says None and the caller reads
``/proc``. Standard library only: the structures are packed by hand (linux/inet_diag.h).
"""

from __future__ import annotations

import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST_DUMP = 0x301  # NLM_F_REQUEST | NLM_F_DUMP
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN = 10
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
REQUEST = struct.Struct("=BBBBI48x")  # inet_diag_req_v2: family, protocol, ext, pad, states, id
SPORT = struct.Struct(">H")  # inet_diag_msg.id.idiag_sport, at 4: network byte order
INODE = struct.Struct("=I")  # inet_diag_msg.idiag_inode, at 68
MSG_BYTES = 72  # sizeof(struct inet_diag_msg)
RECV_BYTES = 65536
TIMEOUT_S = 1.0


def listening_inodes(port: int) -> set[int] | None:
    """The inodes of the sockets listening on TCP ``port`` (IPv4 and IPv6) in this process's
    network namespace — the one ``/proc/net/tcp`` shows; None where netlink is refused."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as link:
            link.settimeout(TIMEOUT_S)  # the kernel answers at once; never hang a sampler
            found: set[int] = set()
            for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
                found |= _dump(link, seq, family, port)
            return found
    except (OSError, AttributeError, struct.error):  # AttributeError: no AF_NETLINK here
        return None


def _dump(link: socket.socket, seq: int, family: int, port: int) -> set[int]:
    request = REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN)
    size = HEADER.size + len(request)
    link.send(HEADER.pack(size, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST_DUMP, seq, 0) + request)
    found: set[int] = set()
    while True:
        data = link.recv(RECV_BYTES)
        if not data:
            raise OSError("netlink: no answer")
        offset = 0
        while offset + HEADER.size <= len(data):
            length, kind, _, _, _ = HEADER.unpack_from(data, offset)
            if kind == NLMSG_DONE:
                return found
            if kind == NLMSG_ERROR or length < HEADER.size + MSG_BYTES:
                raise OSError("netlink: sock_diag refused the request")
            body = offset + HEADER.size
            if SPORT.unpack_from(data, body + 4)[0] == port:
                found.add(INODE.unpack_from(data, body + 68)[0])
            offset += (length + 3) & ~3
