"""An asyncio FIFO of prompts that can be closed to end the rollout loop."""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

from asyncrlhf._checks import check_nonnegative_int

__all__ = ["PromptQueue", "PromptQueueClosed"]

T = TypeVar("T")


class PromptQueueClosed(RuntimeError):
    """Raised by ``get`` on a closed, drained queue and by ``put`` on a closed queue."""


class PromptQueue(Generic[T]):
    """Asyncio FIFO with ``close()``: consumers drain what is left, then get a clear error.

    ``maxsize=0`` means unbounded; ``put`` waits for room on a full bounded queue.
    """

    def __init__(self, maxsize: int = 0) -> None:
        self._queue: asyncio.Queue[T] = asyncio.Queue(maxsize=check_nonnegative_int("maxsize", maxsize))
        self._closed = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def qsize(self) -> int:
        return self._queue.qsize()

    def empty(self) -> bool:
        return self._queue.empty()

    def close(self) -> None:
        """Refuse new prompts; waiting and later ``get`` calls fail once drained."""
        self._closed.set()

    def put_nowait(self, item: T) -> None:
        self._check_open()
        self._queue.put_nowait(item)

    async def put(self, item: T) -> None:
        self._check_open()
        await self._queue.put(item)

    def get_nowait(self) -> T:
        """Next prompt; ``asyncio.QueueEmpty`` if none is ready, PromptQueueClosed if none ever will be."""
        if self._queue.empty() and self.closed:
            raise self._drained()
        return self._queue.get_nowait()

    async def get(self) -> T:
        """Next prompt, waiting for one; PromptQueueClosed once closed and drained."""
        while True:
            if not self._queue.empty():
                return self._queue.get_nowait()
            if self.closed:
                raise self._drained()
            getter = asyncio.ensure_future(self._queue.get())
            closer = asyncio.ensure_future(self._closed.wait())
            try:
                await asyncio.wait({getter, closer}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                getter.cancel()
                closer.cancel()
                raise
            closer.cancel()
            if not getter.done():
                getter.cancel()
                await asyncio.wait({getter})
            # The getter may have taken an item in the same loop turn as the close.
            if not getter.cancelled():
                return getter.result()

    def _check_open(self) -> None:
        if self.closed:
            raise PromptQueueClosed("put on a closed PromptQueue: the rollout loop has ended")

    @staticmethod
    def _drained() -> PromptQueueClosed:
        return PromptQueueClosed("get on a closed, empty PromptQueue: no more prompts will arrive")
