"""tuner/testing/fake_clock.py: virtual time moves only when every loop on it is idle, by
exactly what the earliest timer asks, and never for a server alone."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time

import pytest

from tuner.testing.fake_clock import START_S, VirtualClock


def test_a_loop_alone_sleeps_virtual_seconds_at_once(tmp_path) -> None:
    clock = VirtualClock.create(tmp_path / "clock")
    loop = clock.new_event_loop()
    try:
        assert loop.time() == START_S
        loop.run_until_complete(asyncio.sleep(3600))  # an hour, virtual
        assert clock.now() == pytest.approx(START_S + 3600, abs=1e-9)
    finally:
        loop.close()


def test_a_pickled_clock_reads_the_same_time(tmp_path) -> None:
    clock = VirtualClock.create(tmp_path / "clock")
    loop = clock.new_event_loop()
    try:
        loop.run_until_complete(asyncio.sleep(2.5))
    finally:
        loop.close()
    assert pickle.loads(pickle.dumps(clock)).now() == clock.now() == START_S + 2.5


def _serve(clock: VirtualClock, ready: threading.Event, port: list[int], stop: threading.Event):
    """A server loop on the clock (never alone) answering each line after 0.25 s."""

    async def answer(reader, writer):
        while line := await reader.readline():
            await asyncio.sleep(0.25)
            writer.write(line)
            await writer.drain()
        writer.close()

    async def main():
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        server.close()

    loop = clock.new_event_loop(alone=False)
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_a_client_measures_the_servers_virtual_delay_exactly(tmp_path) -> None:
    server_clock = VirtualClock.create(tmp_path / "clock")
    client_clock = VirtualClock(tmp_path / "clock")  # its own file handle, as another process
    ready, stop, port = threading.Event(), threading.Event(), []
    thread = threading.Thread(target=_serve, args=(server_clock, ready, port, stop))
    thread.start()
    try:
        assert ready.wait(30)

        async def client() -> list[float]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port[0])
            took = []
            for i in range(5):
                t0 = client_clock.now()
                writer.write(f"{i}\n".encode())
                assert await reader.readline() == f"{i}\n".encode()
                took.append(client_clock.now() - t0)
            writer.close()
            return took

        loop = client_clock.new_event_loop()
        try:
            took = loop.run_until_complete(client())
        finally:
            loop.close()
    finally:
        stop.set()
        thread.join(30)
    assert took == pytest.approx([0.25] * 5, abs=1e-9)


def test_a_server_alone_on_the_clock_does_not_run_ahead(tmp_path) -> None:
    clock = VirtualClock.create(tmp_path / "clock")
    loop = clock.new_event_loop(alone=False)

    async def main() -> bool:
        sleeper = asyncio.ensure_future(asyncio.sleep(10))
        # Idle with a timer 10 virtual seconds out, while a thread takes 0.3 wall seconds.
        await loop.run_in_executor(None, time.sleep, 0.3)
        done = sleeper.done()
        sleeper.cancel()
        return done

    try:
        assert loop.run_until_complete(main()) is False
        assert clock.now() == START_S
    finally:
        loop.close()
