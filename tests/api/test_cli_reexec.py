"""`batchgate serve` started with a secret variable runs itself again without it, the secret
handed over a pipe (the end-to-end test reads /proc/<pid>/environ): the receiving half."""

from __future__ import annotations

import json
import os

import pytest

from api.cli import SECRETS_FD, handed_secrets


def pipe_holding(data: bytes) -> int:
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    return read


def test_the_secrets_handed_over_are_read_once_and_their_pipe_closed() -> None:
    fd = pipe_holding(json.dumps({"BATCHGATE_ADMIN_KEY": "s3cret",
                                  "BATCHGATE_WORKERS": "9"}).encode())
    environ = {SECRETS_FD: str(fd), "HOME": "/root"}
    assert handed_secrets(environ) == {"BATCHGATE_ADMIN_KEY": "s3cret"}  # secrets only
    assert environ == {"HOME": "/root"}  # not passed on to the processes spawned
    with pytest.raises(OSError):
        os.fstat(fd)


def test_no_pipe_named_is_no_secret() -> None:
    assert handed_secrets({"HOME": "/root"}) == {}


def test_a_variable_that_names_no_pipe_of_secrets_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match=SECRETS_FD):
        handed_secrets({SECRETS_FD: "not-a-number"})
    with pytest.raises(ValueError, match=SECRETS_FD):
        handed_secrets({SECRETS_FD: str(pipe_holding(b"{not json"))})
