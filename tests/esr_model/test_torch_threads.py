"""Only the model thread may keep a torch thread pool: the helpers that keep other torch work off it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from esr_model.torch_threads import on_own_thread, single_threaded


def test_on_own_thread_runs_elsewhere_and_the_thread_then_exits():
    async def main():
        ran_on = await on_own_thread(threading.current_thread)
        assert ran_on is not threading.current_thread()
        give_up = time.monotonic() + 5
        while ran_on.is_alive():  # its exit is what frees a torch pool it made
            assert time.monotonic() < give_up, "worker thread did not exit"
            await asyncio.sleep(0.01)

    asyncio.run(main())


def test_on_own_thread_passes_errors_back():
    def broken():
        raise ValueError("bad head")

    with pytest.raises(ValueError, match="bad head"):
        asyncio.run(on_own_thread(broken))


def test_single_threaded_restores_the_thread_count():
    before = torch.get_num_threads()
    with single_threaded():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
