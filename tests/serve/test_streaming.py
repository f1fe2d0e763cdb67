"""How a request's engine deltas become its reply chunks (quantkit/serve/server/streaming.py): deltas of one
choice already queued behind each other go out as one, in order, never across choices, never past a finish
or an engine error; a consumer that keeps up gets each as it comes.  Budget: under 1 s."""

from __future__ import annotations

import asyncio

from quantkit.serve.protocol import ProtocolError
from quantkit.serve.server.client import Delta, Sink
from quantkit.serve.server.streaming import deltas


def drain(items: list, n_reqs: int, spaced: bool = False) -> list:
    async def main() -> list:
        sink = Sink()
        out = []

        async def feed() -> None:
            for x in items:
                sink.queue.put_nowait(x)
                if spaced:
                    await asyncio.sleep(0)  # the consumer runs between two posts
                    await asyncio.sleep(0)

        feeder = asyncio.ensure_future(feed()) if spaced else None
        if not spaced:
            await feed()
        try:
            async for d in deltas([None] * n_reqs, sink):
                out.append(d)
        except ProtocolError as e:
            out.append(e)
        if feeder is not None:
            await feeder
        return out

    return asyncio.run(main())


def test_queued_deltas_of_one_choice_merge_in_order():
    items = [Delta(0, "a", [1], ["la"]), Delta(0, "b", [2], ["lb"]), Delta(1, "c", [3]), Delta(0, "d", [4], ["ld"], "length"),
             Delta(0, "late", [9]), Delta(1, "e", [5], [], "stop", 7)]  # fmt: skip
    got = drain(items, 2)
    assert [(d.index, d.text, d.tokens, d.logprobs, d.finish_reason) for d in got[:3]] == [
        (0, "ab", [1, 2], ["la", "lb"], None), (1, "c", [3], [], None), (0, "d", [4], ["ld"], "length")]  # fmt: skip
    # a finished choice takes nothing more into its last delta; the other choice's finish and stop reason pass
    assert (got[3].index, got[3].text) == (0, "late") and (got[4].text, got[4].finish_reason, got[4].stop_reason) == ("e", "stop", 7)


def test_a_consumer_that_keeps_up_gets_every_delta_and_errors_end_the_stream():
    items = [Delta(0, "a", [1]), Delta(0, "b", [2]), Delta(0, "c", [3], [], "length")]
    assert [d.text for d in drain(items, 1, spaced=True)] == ["a", "b", "c"]
    got = drain([Delta(0, "a", [1]), RuntimeError("the engine failed on this batch"), Delta(0, "b", [2])], 1)
    assert got[0].text == "a" and isinstance(got[1], ProtocolError) and len(got) == 2
