"""The harness's call slots wait without polling (harness_batched.CallSlots: a slot given back or granted wakes a
waiter at once, across forked processes; one whose holder died is found within WAKE_S), and a child artifact is
waited for as it ends (harness_children.wait_child: at once, or killed at its deadline)."""

from __future__ import annotations

import os
import signal
import threading
import time

from fakes import harness


def _module(name: str):
    return harness()._plugin(name)


def _waiter(slots, got: list):
    def take():
        fd = slots.take()
        got.append(time.monotonic())
        slots.give(fd)
    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread


def test_a_slot_given_back_wakes_a_waiter_at_once_and_waiting_scans_no_more_than_its_timeout(monkeypatch):
    h = _module("harness_batched")
    slots = h.CallSlots(1, 2)
    slots.WAKE_S = 5.0                               # a wake by the timeout would take seconds
    held = slots.take()
    scans = []
    real_open = os.open

    def counting_open(path, *args, **kw):
        if str(path).startswith(slots.folder):
            scans.append(path)
        return real_open(path, *args, **kw)
    monkeypatch.setattr(os, "open", counting_open)
    got = []
    thread = _waiter(slots, got)
    time.sleep(1.2)                                  # waiting: a scan per WAKE_S, not one per 20 ms
    assert got == [] and len(scans) <= 2, len(scans)
    given = time.monotonic()
    slots.give(held)
    thread.join(timeout=30)
    assert got and got[0] - given < 2.0              # woken by the byte, not by the timeout


def test_a_grant_wakes_a_waiter_at_once():
    h = _module("harness_batched")
    slots = h.CallSlots(1, 2)
    slots.WAKE_S = 5.0
    held = slots.take()
    got = []
    thread = _waiter(slots, got)
    time.sleep(0.2)
    granted = time.monotonic()
    slots.grant()                                   # the host's SIGUSR1: a second slot
    thread.join(timeout=30)
    assert got and got[0] - granted < 2.0 and slots.allowed() == 2
    slots.give(held)


def test_a_slot_given_back_in_a_forked_child_wakes_the_parent_and_a_dead_holder_frees_its_slot():
    h = _module("harness_batched")
    slots = h.CallSlots(1, 1)
    back_r, back_w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the child: hold the only slot a while, give it back, then
        try:                                        # take it again and die holding it
            fd = slots.take()
            os.write(back_w, b"h")
            time.sleep(0.5)
            slots.give(fd)
            time.sleep(0.3)
            slots.take()
            os.write(back_w, b"again")
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    os.close(back_w)
    assert os.read(back_r, 1) == b"h"
    slots.WAKE_S = 5.0                              # this process's copy: a wake by the timeout would take 5 s
    t0 = time.monotonic()
    fd = slots.take()                               # the child gives it back after 0.5 s
    waited = time.monotonic() - t0
    assert waited < 3.0, waited                     # held until the child gave it: the handshake above
    slots.give(fd)
    slots.WAKE_S = 0.5
    assert os.read(back_r, 5) == b"again"
    t0 = time.monotonic()
    fd = slots.take()                               # its holder is killed after 0.5 s: no byte, the kernel's unlock
    waited = time.monotonic() - t0
    assert waited < 0.5 + slots.WAKE_S + 2.0, waited
    slots.give(fd)
    os.waitpid(pid, 0)
    os.close(back_r)


def _child(seconds: float) -> int:
    pid = os.fork()
    if pid == 0:
        time.sleep(seconds)
        os._exit(7)
    return pid


def test_a_child_is_waited_for_as_it_ends_and_killed_at_its_deadline(monkeypatch):
    c = _module("harness_children")
    flags, real_waitpid = [], os.waitpid

    def counting_waitpid(pid, options):
        flags.append(options)
        return real_waitpid(pid, options)
    monkeypatch.setattr(os, "waitpid", counting_waitpid)
    t0 = time.monotonic()
    status = c.wait_child(_child(1.0), time.monotonic() + 60)
    assert os.waitstatus_to_exitcode(status) == 7 and time.monotonic() - t0 < 1.0 + 1.0
    assert flags == [0]                             # one wait as it ends, no polling with WNOHANG
    t0 = time.monotonic()
    assert c.wait_child(_child(30), time.monotonic() + 0.4) is None     # past its time: killed
    assert 0.35 < time.monotonic() - t0 < 2
    assert os.waitstatus_to_exitcode(c.wait_child(_child(0.05), None)) == 7
