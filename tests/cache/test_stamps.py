"""Files known by their stat (tiergate.state.stamps): an unchanged file is not read again, any write is seen, and
a file written in the last clock tick is never believed by its stamp."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from tiergate.state import stamps


def _aged(path, seconds=10.0):
    """Set the file's times `seconds` back (its ctime moves to now: it must be still for a tick after)."""
    then = time.time_ns() - int(seconds * 1e9)
    os.utime(path, ns=(then, then))


def _still(path):
    """Wait until the file is settled (its ctime, moved by utime, is older than a tick)."""
    deadline = time.time() + 5
    while not stamps.settled(stamps.stamp(path)):
        assert time.time() < deadline
        time.sleep(0.05)


def test_a_settled_file_is_read_once_and_any_write_is_seen(tmp_path, tiergate_home, monkeypatch):
    path = tmp_path / "data.bin"
    path.write_bytes(b"a" * 4096)
    _still(path)
    known = stamps.KnownHashes()
    assert known.sha256(path) == hashlib.sha256(b"a" * 4096).hexdigest()
    known.save()

    reads = []
    real = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda *a, **k: reads.append(1) or real(*a, **k))
    again = stamps.KnownHashes()                      # a new process: the sealed record
    assert again.sha256(path) == hashlib.sha256(b"a" * 4096).hexdigest() and not reads

    path.write_bytes(b"b" * 4096)                     # same size; mtime set back: ctime still moves
    _aged(path)
    _still(path)
    assert again.sha256(path) == hashlib.sha256(b"b" * 4096).hexdigest() and reads


def test_a_file_written_within_a_tick_is_read_every_time(tmp_path, tiergate_home, monkeypatch):
    path = tmp_path / "fresh.bin"
    path.write_bytes(b"x")
    _aged(path, -60.0)                                # its last change ahead of the clock: within a tick, however slow
    known = stamps.KnownHashes()
    known.sha256(path)
    assert not known.changed                          # not remembered: its stamp could repeat after a write
    assert not stamps.settled(stamps.stamp(path))


def test_an_edited_record_is_not_believed(tmp_path, tiergate_home):
    path = tmp_path / "m.bin"
    path.write_bytes(b"model")
    _still(path)
    known = stamps.KnownHashes()
    known.sha256(path)
    known.save()
    record = tiergate_home / "quick" / stamps.KNOWN_FILE
    text = record.read_text().replace(hashlib.sha256(b"model").hexdigest(), "0" * 64)
    record.write_text(text)
    assert stamps.KnownHashes().files == {}           # its seal no longer verifies


def test_a_folder_stamp_names_every_file_and_refuses_links(tmp_path):
    folder = tmp_path / "run"
    (folder / "sub").mkdir(parents=True)
    (folder / "result.json").write_text("{}")
    (folder / "sub" / "outputs.npz").write_bytes(b"0")
    found = stamps.folder_stamp(folder)
    assert set(found) == {"result.json", "sub/outputs.npz"}
    (folder / "sub" / "outputs.npz").write_bytes(b"1")
    assert stamps.folder_stamp(folder) != found
    (folder / "link").symlink_to(folder / "result.json")
    assert stamps.folder_stamp(folder) is None
    assert stamps.folder_stamp(tmp_path / "absent") is None


@pytest.mark.parametrize("ns,coarse", [(1_700_000_000_123_456_789, False), (1_700_000_000_000_000_000, True)])
def test_whole_second_file_systems_wait_longer(ns, coarse):
    found = [1, 2, 3, ns, ns]
    assert stamps.settled(found, ns + int(1.0e9)) is not coarse
    assert stamps.settled(found, ns + int(3.0e9))


class _Clock:
    """stamps' clock, moved only by its own sleep: the order of write, stamp and wait is certain by construction."""

    def __init__(self, now_ns: int):
        self.now, self.slept = now_ns, []

    def time_ns(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += int(seconds * 1e9)


def test_a_folder_written_a_moment_ago_is_stamped_once_it_can_be_believed(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "outputs.npz").write_bytes(b"0" * 64)
    newest = max(max(one[3], one[4]) for one in stamps.folder_stamp(folder).values())
    clock = _Clock(newest)                            # the moment of the last write
    monkeypatch.setattr(stamps, "time", clock)
    assert not stamps.folder_settled(stamps.folder_stamp(folder))
    found = stamps.settled_folder_stamp(folder)
    assert clock.slept and 0 < clock.slept[0] <= stamps.RACY_S + 0.02          # waited out the rest of a tick
    assert stamps.folder_settled(found) and found == stamps.folder_stamp(folder)
    clock.now = newest - int(10e9)                    # written "10 s from now" (a clock set back): no long wait
    clock.slept.clear()
    assert not stamps.folder_settled(stamps.settled_folder_stamp(folder)) and not clock.slept


def test_a_folder_written_before_the_clock_mark_is_believed_at_once(tmp_path, monkeypatch):
    """A run folder the gate has just written is stamped without waiting out a tick: the mark, a write taken after
    the folder's, is stamped by the same file system's clock; a file written after the mark is not vouched for."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "outputs.npz").write_bytes(b"0" * 64)
    newest = max(max(one[3], one[4]) for one in stamps.folder_stamp(folder).values())
    while True:                                    # the mark in a later tick of the file system than the folder
        mark = stamps.clock_mark(tmp_path / "quick" / stamps.MARK_FILE)
        if mark[1] > newest:
            break
    clock = _Clock(newest)                         # the moment of the last write: not settled by the clock
    monkeypatch.setattr(stamps, "time", clock)
    assert not stamps.folder_settled(stamps.folder_stamp(folder))
    found = stamps.believed_folder_stamp(folder, mark)
    assert found == stamps.folder_stamp(folder) and not clock.slept      # believed at once, no wait
    assert stamps.changed_before(found, mark)
    assert not stamps.changed_before(found, (mark[0] + 1, mark[1]))      # a mark on another device vouches for none
    assert not stamps.changed_before(found, None) and not stamps.changed_before({}, mark)
    (folder / "result.json").write_text("{}")      # written after the mark: waits out a tick as before
    later = stamps.folder_stamp(folder)
    assert not stamps.changed_before(later, mark)  # its time is the mark's or after: the file system's one clock
    clock.now = max(max(one[3], one[4]) for one in later.values())
    stamps.believed_folder_stamp(folder, mark)
    assert clock.slept


def test_the_clock_mark_is_a_write_in_the_homes_quick_folder(tmp_path, tiergate_home):
    """The clock mark is written in the home's quick/ folder, and read back as its device and time."""
    mark = stamps.clock_mark()
    assert mark is not None and (tiergate_home / "quick" / stamps.MARK_FILE).is_file()
    st = os.stat(tiergate_home / "quick" / stamps.MARK_FILE)
    assert mark == (st.st_dev, st.st_mtime_ns)
    (tmp_path / "a-file").write_text("")
    assert stamps.clock_mark(tmp_path / "a-file" / "below-a-file") is None      # cannot be written: None
