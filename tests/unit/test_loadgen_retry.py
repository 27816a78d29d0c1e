"""The overload load generator's refused clients: they wait out Retry-After, stretched by their jitter.

A server that refuses everything with ``Retry-After: 1`` and a 1.5 s window: a client that waits exactly
1 s sends twice; with jitter 1 a client waits 1-2 s, so about half send once. Clients refused together
and waiting exactly Retry-After come back together, which is what made the refusal p99 a burst's length.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gfaas.bench.loadgen import LoadSpec, _drive
from gfaas.errors import ConfigError

REFUSAL = (b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\ncontent-length: 2\r\n"
           b"content-type: application/json\r\n\r\n{}")


async def _refusing_run(connections: int, jitter: float, close_idle: bool = False) -> tuple[dict[str, Any], list[float]]:
    arrivals: list[float] = []
    loop = asyncio.get_running_loop()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                arrivals.append(loop.time())
                writer.write(REFUSAL)
                await writer.drain()
                if close_idle:  # as a keep-alive timeout shorter than Retry-After does
                    await asyncio.sleep(0.2)
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        row = await _drive(LoadSpec(f"http://127.0.0.1:{port}/x", "{}", connections, 1.5, drain_s=5,
                                    request_timeout_s=5, retry_jitter=jitter))
    finally:
        server.close()
    return row, arrivals


def test_without_jitter_every_refused_client_returns_after_exactly_retry_after() -> None:
    row, arrivals = asyncio.run(_refusing_run(20, 0.0))
    assert row["sent"] == row["rejected"] == 40  # each client: at 0 and at 1 s, then the window is over
    second = sorted(arrivals)[20:]
    assert max(second) - min(second) < 0.25  # the second wave is one burst


def test_jitter_spreads_the_returns_over_retry_after_times_one_to_two() -> None:
    row, arrivals = asyncio.run(_refusing_run(40, 1.0))
    assert row["rejected"] == row["sent"]
    assert 40 + 5 <= row["sent"] <= 40 + 35  # those drawing a wait past 1.5 s do not come back in the window
    t0 = min(arrivals)
    second = [a - t0 for a in arrivals if a - t0 > 0.5]
    assert min(second) >= 0.95 and max(second) <= 1.6


@pytest.mark.parametrize("bad", [-0.1, 11.0])
def test_a_jitter_outside_0_to_10_is_refused(bad: float) -> None:
    with pytest.raises(ConfigError, match="retry_jitter"):
        LoadSpec("http://127.0.0.1:1/x", "{}", 1, 1.0, retry_jitter=bad)


def test_a_connection_the_server_closed_while_idle_is_reopened_not_failed() -> None:
    row, arrivals = asyncio.run(_refusing_run(10, 0.0, close_idle=True))
    assert row["failed"] == 0 and row["sent"] == row["rejected"] == 20, row
    assert row["idle_closed"] == 10 and row["connects"] == 20
