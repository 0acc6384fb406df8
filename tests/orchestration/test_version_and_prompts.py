from __future__ import annotations

import asyncio
import threading

import pytest

from asyncrlhf.orchestration import PromptQueue, PromptQueueClosed, VersionManager


def test_version_manager_bumps_and_measures_staleness():
    vm = VersionManager(initial=3)
    assert vm.version == 3 and vm() == 3
    assert vm.bump() == 4
    assert vm.staleness(1) == 3 and vm.staleness(4) == 0


def test_version_manager_is_thread_safe():
    vm = VersionManager()
    threads = [threading.Thread(target=lambda: [vm.bump() for _ in range(10_000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert vm.version == 40_000


def test_initial_version_must_be_non_negative():
    with pytest.raises(ValueError, match="initial"):
        VersionManager(initial=-1)


def test_prompt_queue_fifo_and_close():
    async def scenario() -> list:
        q: PromptQueue[str] = PromptQueue()
        q.put_nowait("a")
        await q.put("b")
        assert q.qsize() == 2
        got = [await q.get(), q.get_nowait()]
        with pytest.raises(asyncio.QueueEmpty):
            q.get_nowait()
        q.put_nowait("c")
        q.close()
        got.append(await q.get())  # what was queued before close is still served
        with pytest.raises(PromptQueueClosed, match="closed, empty"):
            await q.get()
        with pytest.raises(PromptQueueClosed, match="closed"):
            q.get_nowait()
        with pytest.raises(PromptQueueClosed, match="put on a closed"):
            await q.put("d")
        return got

    assert asyncio.run(scenario()) == ["a", "b", "c"]


def test_close_wakes_a_waiting_getter():
    async def scenario() -> None:
        q: PromptQueue[int] = PromptQueue()
        waiter = asyncio.create_task(q.get())
        await asyncio.sleep(0.01)
        q.close()
        with pytest.raises(PromptQueueClosed):
            await asyncio.wait_for(waiter, timeout=5.0)

    asyncio.run(scenario())


def test_bounded_queue_put_waits_for_room():
    async def scenario() -> list[int]:
        q: PromptQueue[int] = PromptQueue(maxsize=1)
        await q.put(1)
        blocked = asyncio.create_task(q.put(2))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        first = await q.get()
        await blocked
        return [first, await q.get()]

    assert asyncio.run(scenario()) == [1, 2]


def test_cancelled_getter_loses_nothing():
    async def scenario() -> int:
        q: PromptQueue[int] = PromptQueue()
        waiter = asyncio.create_task(q.get())
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        q.put_nowait(7)
        return await q.get()

    assert asyncio.run(scenario()) == 7


def test_maxsize_must_be_non_negative():
    with pytest.raises(ValueError, match="maxsize"):
        PromptQueue(maxsize=-1)
