"""The engine thread's hand-off to the requests' queues: every item arrives, in order, to its own queue; a step's items
take one event-loop wakeup, not one each."""

from __future__ import annotations

import asyncio
import threading

from freetoken.serve.inbox import Inbox


def test_a_steps_items_arrive_in_order_with_one_wakeup_per_flush():
    async def main():
        loop = asyncio.get_running_loop()
        wakeups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (wakeups.append(1), real(*a))[1]
        inbox, queues = Inbox(loop), [asyncio.Queue(), asyncio.Queue()]

        def engine():  # 50 steps of two sequences, a flush after each
            for step in range(50):
                for k, q in enumerate(queues):
                    inbox.put(q, (k, step))
                inbox.flush()

        thread = threading.Thread(target=engine)
        thread.start()
        got = [[await q.get() for _ in range(50)] for q in queues]
        thread.join()
        assert got == [[(k, s) for s in range(50)] for k in range(2)]
        assert 1 <= len(wakeups) <= 50  # at most one per step; fewer where a wakeup was still on its way
        inbox.flush()  # nothing waiting: no wakeup
        assert len(wakeups) <= 50 and all(q.empty() for q in queues)

    asyncio.run(main())
