"""How ``claimed_by`` names a worker's processes, so the sweeper finds a lost worker's
attempts by what their rows carry (``queuety.runtime.claim``)."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime

import pytest

from queuety.models import StepRun
from queuety.runtime import claim

STARTED = datetime(2026, 12, 2, 9, 30, 5, 123456, tzinfo=UTC)


@pytest.fixture
def unnamed(monkeypatch):
    """This process as it is outside a worker; named workers are undone after each test."""
    monkeypatch.setattr(claim, "_worker", "")


def test_outside_a_worker_a_process_is_host_and_pid(unnamed):
    assert claim.worker_name() == ""
    assert claim.worker_id() == f"{socket.gethostname()}:{os.getpid()}"
    assert claim.worker_id(42) == f"{socket.gethostname()}:42"
    assert claim.worker_of(claim.worker_id(42)) == ""


def test_in_a_worker_every_process_is_named_after_the_worker(unnamed):
    name = claim.name_worker(STARTED)

    assert name == f"{socket.gethostname()}:{os.getpid()}@20261202T093005.123456"
    assert claim.worker_name() == name
    # The pool process's own claim and its main process's record of its death agree.
    assert claim.worker_id(4242) == f"{name}/4242"
    assert claim.worker_id() == f"{name}/{os.getpid()}"
    assert claim.worker_of(claim.worker_id(4242)) == name


@pytest.mark.parametrize("claimed_by", [
    "", "web-1:311", "web-1:311/7", "web-1:311@20261202T093005.123456/", "a@b/c",
])
def test_a_claimed_by_that_names_no_worker(claimed_by):
    assert claim.worker_of(claimed_by) == ""


def test_a_long_host_name_still_fits_claimed_by(unnamed, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "h" * 255)
    claim.name_worker(STARTED)

    claimed_by = claim.worker_id(4_194_304)  # the largest pid Linux hands out

    assert len(claimed_by) <= StepRun._meta.get_field("claimed_by").max_length
    assert claim.worker_of(claimed_by) == claim.worker_name()


def test_a_process_forked_after_naming_claims_as_its_main_process_records_it(unnamed):
    """A replacement pool process, forked later, inherits the name: the claimed_by it writes
    is the one its main process computes from its pid when it dies."""
    claim.name_worker(STARTED)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the "pool process"
        os.write(write, claim.worker_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as pipe:
        assert pipe.read() == claim.worker_id(child)


@pytest.mark.parametrize(("claimed_by", "pid"), [
    ("web-1:4242@20261202T120000.000001/4250", 4250),
    ("web-1:4242", 4242),
    ("", None),
    ("web-1:4242@20261202T120000.000001/", None),
])
def test_pid_of__reads_the_process_in_either_form(claimed_by, pid):
    assert claim.pid_of(claimed_by) == pid
