"""engine/entrypoints/engine_thread.py: a request's acceptance is settled on the event
loop, and left alone where its caller has gone."""

from __future__ import annotations

import asyncio

from hetero_infer.engine.entrypoints.engine_thread import settle


def test_settle_tells_the_caller_unless_it_has_gone():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        accepted, refused = loop.create_future(), loop.create_future()
        settle(accepted, None, 7)
        settle(refused, ValueError("refused"))
        assert accepted.result() == 7
        assert isinstance(refused.exception(), ValueError)
        for error in (None, ValueError("refused")):
            gone = loop.create_future()
            gone.cancel()  # the client left while the engine thread took the request
            settle(gone, error, 7)  # nothing to tell, and no error for the engine thread
            assert gone.cancelled()

    asyncio.run(main())
