"""A server start from a process with more than 1,023 descriptors open (a batch restarting its
server holds a socket per request in flight): the supervisor's handoff is read all the same."""

from __future__ import annotations

import os
import resource

import pytest

from calibrate.server.supervise import _read_handoff


def test_the_handoff_is_read_past_descriptor_1023() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this machine allows {hard} descriptors a process")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held: list[int] = []
    try:
        while True:  # descriptors up past 1023, then the handoff's pipe above them
            read_fd, write_fd = os.pipe()
            held += [read_fd, write_fd]
            if read_fd > 1030:
                break
        os.write(write_fd, b"started 4242\n")
        assert _read_handoff(read_fd, 5.0) == "started 4242"  # select() raised ValueError here
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
