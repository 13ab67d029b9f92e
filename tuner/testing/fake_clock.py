"""A virtual clock shared by processes, for tests whose assertions are about timing.

The fake engine (tuner.testing.fake_engine, script key `virtual_clock`) and the load generator
(`tuner.measure.loadgen_clock.clock`) each run an asyncio loop whose `time()` is this clock.
Virtual time stands still while any of those loops has work, and jumps to the earliest timer of
all of them once every one is idle: a token due 6 ms after the last one is stamped exactly 6 ms
later, however long the host took to get there. So a load a test runs beside cannot move a TTFT,
a throughput or a ratio the test bounds.

"Idle" is decided without any wall-clock wait, from three facts:
- a loop is idle when asyncio is about to block (nothing ready) and `select(0)` finds nothing;
- a loop that did work bumps the shared epoch before it says it is idle, and only once the
  kernel has acknowledged every byte it wrote (TIOCOUTQ 0: the bytes are in the peer's receive
  queue, where the peer's `select(0)` sees them), so a peer idle in an older epoch must look
  again;
- time advances only when every live loop said "idle" in the current epoch, and never for a
  server alone on it (it has nobody to keep time for).
Loops that are not on the clock (urllib, the test's own code) never hold it up; a process that
died on it is dropped. State lives in a small file (mmap), guarded by flock; loops wake each
other through abstract Unix datagram sockets.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import math
import mmap
import os
import selectors
import socket
import struct
import termios
from pathlib import Path

START_S = 1000.0  # never 0: a stamp of 0.0 would read as "no stamp" to an `or`
MAX_LOOPS = 32
_HEAD = struct.Struct("=dq")  # now, epoch
_SLOT = struct.Struct("=qqdq")  # pid (0: free), idle epoch (-1: busy), next timer, alone ok
_BUSY = -1
_POLL_S = 0.05  # a lost wake-up costs this much wall time, never a wrong time


class VirtualClock:
    """Virtual seconds shared through `path`. Picklable: a spawned process reopens the file."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._fd = os.open(self.path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, _HEAD.size + MAX_LOOPS * _SLOT.size)

    @classmethod
    def create(cls, path: str | Path) -> VirtualClock:
        """A fresh clock at START_S with no loop on it."""
        Path(path).write_bytes(_HEAD.pack(START_S, 0) + bytes(MAX_LOOPS * _SLOT.size))
        return cls(path)

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    def now(self) -> float:
        return _HEAD.unpack_from(self._map, 0)[0]

    def new_event_loop(self, *, alone: bool = True) -> asyncio.AbstractEventLoop:
        """An asyncio loop on this clock; it joins the clock now and leaves when closed.
        `alone=False`: time never moves for this loop alone (a server, whose housekeeping
        timers must not run ahead while a client off the clock is mid-request)."""
        return _VirtualLoop(self, alone=alone)

    # -- shared state, all under the lock ------------------------------------------------------
    def _lock(self) -> _Locked:
        return _Locked(self._fd)

    def _head(self) -> tuple[float, int]:
        return _HEAD.unpack_from(self._map, 0)

    def _set_head(self, now: float, epoch: int) -> None:
        _HEAD.pack_into(self._map, 0, now, epoch)

    def _slot(self, i: int) -> tuple[int, int, float, int]:
        return _SLOT.unpack_from(self._map, _HEAD.size + i * _SLOT.size)

    def _set_slot(self, i: int, pid: int, idle: int, timer: float, alone: int | None = None
                  ) -> None:
        if alone is None:
            alone = self._slot(i)[3]
        _SLOT.pack_into(self._map, _HEAD.size + i * _SLOT.size, pid, idle, timer, alone)

    def _join(self, alone: bool) -> int:
        with self._lock():
            for i in range(MAX_LOOPS):
                pid = self._slot(i)[0]
                if pid == 0 or not _alive(pid):
                    self._set_slot(i, os.getpid(), _BUSY, math.inf, int(alone))
                    return i
        raise RuntimeError(f"more than {MAX_LOOPS} event loops on the virtual clock {self.path}")

    def _leave(self, i: int) -> None:
        """This loop closes: the others say again whether they are idle, now without it."""
        with self._lock():
            now, epoch = self._head()
            self._set_head(now, epoch + 1)
            self._set_slot(i, 0, _BUSY, math.inf)
        _wake_all(self, i)

    def _bump(self, i: int) -> int:
        """This loop did work: every idle word said before now is void. Returns the epoch."""
        with self._lock():
            now, epoch = self._head()
            self._set_head(now, epoch + 1)
            self._set_slot(i, os.getpid(), _BUSY, math.inf)
        _wake_all(self, i)
        return epoch + 1

    def _declare_idle(self, i: int, epoch: int, timer: float) -> bool:
        """Say "idle until `timer`" as of `epoch`; False if the epoch moved meanwhile. Advances
        the clock where this makes every loop idle."""
        with self._lock():
            if self._head()[1] != epoch:
                return False
            self._set_slot(i, os.getpid(), epoch, timer)
            advanced = self._advance_if_all_idle(i)
        if advanced:
            _wake_all(self, i)
        return True

    def _busy(self, i: int) -> None:
        with self._lock():
            self._set_slot(i, os.getpid(), _BUSY, math.inf)

    def _advance_if_all_idle(self, me: int) -> bool:
        now, epoch = self._head()
        timers, may_run_alone = [], False
        for j in range(MAX_LOOPS):
            pid, idle, timer, alone = self._slot(j)
            if pid == 0:
                continue
            if idle != epoch:
                if j != me and not _alive(pid):
                    self._set_slot(j, 0, _BUSY, math.inf)  # died on the clock
                    continue
                return False
            timers.append(timer)
            may_run_alone = bool(alone)
        # A server alone on the clock (between levels) would skip through its housekeeping
        # timers (keep-alive, lingering) while a client off the clock (urllib reading
        # /metrics) is mid-request: time moves for one loop only where it may run alone.
        if (not timers or (len(timers) == 1 and not may_run_alone)
                or math.isinf(soonest := min(timers))):
            return False
        self._set_head(max(now, soonest), epoch + 1)
        return True


class _Locked:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _wake_name(clock: VirtualClock, slot: int) -> bytes:
    return f"\0tuner-virtual-clock-{os.stat(clock.path).st_ino}-{slot}".encode()


def _wake_all(clock: VirtualClock, me: int) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.setblocking(False)
        for j in range(MAX_LOOPS):
            if j != me and clock._slot(j)[0]:
                try:
                    s.sendto(b"w", _wake_name(clock, j))
                except OSError:
                    pass  # gone, or its queue is full: awake either way


def _unsent_or_unacked(fd: int) -> int:
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.TIOCOUTQ, buf)
    except OSError:
        return 0  # a listening socket, a pipe: nothing it wrote is on its way
    return buf[0]


class _VirtualSelector(selectors.BaseSelector):
    """The loop's selector: returns at once while the loop has work, else takes part in the
    clock's idle protocol until an event comes or virtual time reaches the loop's next timer."""

    def __init__(self, clock: VirtualClock, *, alone: bool) -> None:
        self.clock = clock
        self.inner = selectors.DefaultSelector()
        self.slot = clock._join(alone)
        self.wake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.wake.bind(_wake_name(clock, self.slot))
        self.wake.setblocking(False)
        self.inner.register(self.wake, selectors.EVENT_READ, None)
        self.loop: _VirtualLoop | None = None
        self.worked = True

    # -- the BaseSelector interface, delegated ------------------------------------------------
    def register(self, fileobj, events, data=None):
        return self.inner.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self.inner.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self.inner.modify(fileobj, events, data)

    def get_key(self, fileobj):
        return self.inner.get_key(fileobj)

    def get_map(self):
        return self.inner.get_map()

    def close(self) -> None:
        self.clock._leave(self.slot)
        self.inner.close()
        self.wake.close()

    # -- select ---------------------------------------------------------------------------------
    def _events(self, timeout: float | None) -> list:
        events = []
        for key, mask in self.inner.select(timeout):
            if key.fileobj is self.wake:
                while True:
                    try:
                        self.wake.recv(64)
                    except BlockingIOError:
                        break
            else:
                events.append((key, mask))
        return events

    def _next_timer(self) -> float:
        scheduled = self.loop._scheduled if self.loop is not None else []
        live = [h.when() for h in scheduled if not h.cancelled()]
        return min(live) if live else math.inf

    def _written_all(self) -> bool:
        return all(_unsent_or_unacked(key.fd) == 0 for key in self.inner.get_map().values()
                   if key.fileobj is not self.wake)

    def select(self, timeout: float | None = None) -> list:
        if timeout is not None and timeout <= 0:
            self.worked = True
            return self._events(0)
        while True:
            if not self._written_all():  # bytes still on their way: not idle yet
                if events := self._events(0.0005):
                    return self._busy(events)
                continue
            epoch = self.clock._bump(self.slot) if self.worked else self.clock._head()[1]
            self.worked = False
            if events := self._events(0):
                return self._busy(events)
            timer = self._next_timer()
            if not self.clock._declare_idle(self.slot, epoch, timer):
                continue
            if self.clock.now() >= timer:
                return self._busy([])
            if events := self._events(_POLL_S):
                return self._busy(events)
            if self.clock.now() >= timer:
                return self._busy([])

    def _busy(self, events: list) -> list:
        self.clock._busy(self.slot)
        self.worked = True
        return events


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock, *, alone: bool = True) -> None:
        selector = _VirtualSelector(clock, alone=alone)
        super().__init__(selector)
        selector.loop = self
        self._virtual_clock = clock

    def time(self) -> float:
        return self._virtual_clock.now()
