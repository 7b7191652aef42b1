"""The adversarial bench's hostile clients stop with the bench that started them."""
import asyncio
import collections
import os
import threading

from profiling.common import adversarial


def test_hostile_clients_stop_when_their_bench_is_gone():
    # a port nothing listens on: a client that did not check would loop on connection errors until the timeout
    bodies = adversarial.Bodies("m", ["unenforced keywords"])
    tally: collections.Counter = collections.Counter()
    orphaned = asyncio.wait_for(adversarial.hostile_client("http://127.0.0.1:9", bodies, 0, threading.Event(), tally,
                                                           parent=os.getppid() + 1), timeout=10)
    asyncio.run(orphaned)
    assert not tally  # it returned before sending anything


def test_hostile_clients_send_while_their_bench_lives():
    bodies = adversarial.Bodies("m", ["unenforced keywords"])
    tally: collections.Counter = collections.Counter()
    stop = threading.Event()

    async def run() -> None:
        task = asyncio.create_task(adversarial.hostile_client("http://127.0.0.1:9", bodies, 0, stop, tally,
                                                              parent=os.getppid()))
        while not tally:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(run())
    assert sum(tally.values()) >= 1 and all(kind == "unenforced keywords" for kind, _, _ in tally)
