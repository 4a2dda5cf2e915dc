"""The SRL actor pool against three real llama.cpp servers (the embedded model) on loopback:
least-loaded routing, a server SIGKILLed mid-request, its return, no healthy actor, the
per-token data llama.cpp returns, and token counting."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from activities.actors import (
    ActorPool,
    ActorRequestError,
    EndpointState,
    Generation,
    NoHealthyActor,
)
from keel.srl.actors import ActorEndpoint, ActorsConfig
from services.model_server import LocalModelServer
from services.processes import free_port, pid_alive

pytestmark = [
    pytest.mark.slow,
    pytest.mark.embedded_model,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None,
        reason="llama_cpp is not installed (uv sync --extra local-model)",
    ),
]

NAMES = ("a", "b", "c")
HELLO = [{"role": "user", "content": "Say hello."}]


class Servers:
    """The module's llama.cpp servers by endpoint name; a test may replace one it restarted."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.by_name: dict[str, LocalModelServer] = {}

    def start(self, name: str, port: int) -> LocalModelServer:
        server = LocalModelServer(
            port=port, threads=1, ctx=1024, log_path=self.log_dir / f"{name}.log"
        )
        server.start(timeout_s=180)
        self.by_name[name] = server
        return server

    def config(self, names: tuple[str, ...] = NAMES, **timings: float) -> ActorsConfig:
        return ActorsConfig(
            endpoints=[
                ActorEndpoint(
                    name=n,
                    base_url=self.by_name[n].base_url,
                    port=self.by_name[n].port,
                    model="smollm2",
                )
                for n in names
            ],
            **timings,
        )


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    held = Servers(tmp_path_factory.mktemp("actors"))
    try:
        for name in NAMES:
            held.start(name, free_port())
        yield held
    finally:
        pids = [s.pid for s in held.by_name.values() if s.pid is not None]
        for s in held.by_name.values():
            s.stop()
        assert not any(pid_alive(p) for p in pids)


def state(pool: ActorPool, name: str) -> EndpointState:
    return next(s for s in pool.snapshot() if s.name == name)


def assert_llama_cpp_tokens(g: Generation) -> None:
    # llama-cpp-python returns each token's text and logprob, never its id.
    assert g.token_ids is None
    assert g.logprobs is not None and g.completion_tokens is not None
    assert len(g.logprobs) == g.completion_tokens > 0
    assert all(lp <= 0.0 for lp in g.logprobs)
    assert g.prompt_tokens is not None and g.prompt_tokens > 0
    assert g.text and g.latency_s > 0


async def test_least_loaded_spreads_concurrent_requests(servers: Servers) -> None:
    async with ActorPool(servers.config()) as pool:
        assert [(s.name, s.healthy, s.server) for s in pool.snapshot()] == [
            (n, True, "models") for n in NAMES
        ]
        gens = await asyncio.gather(
            *(pool.generate(HELLO, max_tokens=8, temperature=0.0, seed=i) for i in range(6))
        )
        assert Counter(g.endpoint for g in gens) == {"a": 2, "b": 2, "c": 2}
        for g in gens:
            assert g.attempts == [g.endpoint]
            assert g.model == "smollm2"
            assert_llama_cpp_tokens(g)
        # One at a time, nothing is in flight: ties go to the fewest served, then the name.
        b_only = ActorPool(servers.config(("b", "c")))
        async with b_only:
            order = [
                (await b_only.generate(HELLO, max_tokens=4, temperature=0.0, seed=1)).endpoint
                for _ in range(3)
            ]
        assert order == ["b", "c", "b"]
        snap = {s.name: s for s in pool.snapshot()}
        assert {n: (s.served, s.in_flight, s.failures) for n, s in snap.items()} == {
            n: (2, 0, 0) for n in NAMES
        }


async def test_count_tokens_uses_the_servers_tokenizer(servers: Servers) -> None:
    text = "def f(x):\n    return x + 1\n"
    async with ActorPool(servers.config()) as pool:
        counted = await pool.count_tokens(text)
        longer = await pool.count_tokens(text * 3)
    async with httpx.AsyncClient() as http:
        resp = await http.post(
            f"http://127.0.0.1:{servers.by_name['a'].port}/extras/tokenize", json={"input": text}
        )
    assert counted == len(resp.json()["tokens"])
    assert longer is not None and counted is not None and longer > counted


async def test_no_healthy_actor(servers: Servers) -> None:
    port = free_port()  # nothing listens here
    nobody = ActorEndpoint(
        name="gone", base_url=f"http://127.0.0.1:{port}/v1", port=port, model="smollm2"
    )
    async with ActorPool(ActorsConfig(endpoints=[nobody])) as pool:
        (snap,) = pool.snapshot()
        assert not snap.healthy and snap.dead_since is not None
        assert snap.last_error is not None and "ConnectError" in snap.last_error
        with pytest.raises(NoHealthyActor) as err:
            await pool.generate(HELLO, max_tokens=4, temperature=0.0, seed=None)
        assert err.value.attempts == []
        assert await pool.count_tokens("x") is None
    # Beside a live one, the dead endpoint gets nothing.
    mixed = ActorsConfig(endpoints=[nobody, *servers.config(("c",)).endpoints])
    async with ActorPool(mixed) as pool:
        gens = [await pool.generate(HELLO, max_tokens=4, temperature=0.0, seed=i) for i in range(2)]
        assert [g.endpoint for g in gens] == ["c", "c"]


async def test_killed_actor_is_drained_its_request_rerouted_and_it_returns(
    servers: Servers,
) -> None:
    victim = servers.by_name["a"]
    port = victim.port
    retry_after = 1.0
    cfg = servers.config(("a", "b"), health_interval_s=0.5, retry_dead_after_s=retry_after)
    async with ActorPool(cfg) as pool, httpx.AsyncClient(timeout=60) as http:
        # Keep a busy (llama-cpp-python serves one request at a time), so the pool's
        # request is accepted and waiting inside the server when the server dies.
        busy = asyncio.create_task(
            http.post(
                f"{victim.base_url}/chat/completions",
                json={"model": "smollm2", "messages": HELLO, "max_tokens": 64},
            )
        )
        await asyncio.sleep(0.3)
        step = asyncio.create_task(pool.generate(HELLO, max_tokens=8, temperature=0.0, seed=7))
        deadline = time.monotonic() + 10
        while state(pool, "a").in_flight == 0:
            assert time.monotonic() < deadline, "the pool never sent the request to a"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        assert victim.pid is not None
        os.killpg(victim.pid, signal.SIGKILL)
        g = await step
        with contextlib.suppress(httpx.HTTPError):
            await busy
        victim.stop()

        assert g.attempts == ["a", "b"] and g.endpoint == "b"
        assert_llama_cpp_tokens(g)
        dead = state(pool, "a")
        assert not dead.healthy and dead.in_flight == 0 and dead.served == 0
        assert dead.failures >= 1 and dead.dead_since is not None and dead.last_error
        # Drained: while it is down, every request goes to b.
        after = [
            await pool.generate(HELLO, max_tokens=4, temperature=0.0, seed=i) for i in range(3)
        ]
        assert [x.endpoint for x in after] == ["b", "b", "b"]
        assert state(pool, "b").served == 4

        down = state(pool, "a")
        servers.start("a", port)  # same port
        # The pool's own re-check of the dead endpoint (every retry_after) brings it back;
        # nothing else can: no request goes to a drained endpoint. The deadline only
        # guards against a hang.
        deadline = time.monotonic() + 60
        while not state(pool, "a").healthy:
            assert time.monotonic() < deadline, f"a never came back: {pool.snapshot()}"
            await asyncio.sleep(0.05)
        back = state(pool, "a")
        assert back.dead_since is None and back.server == "models"
        # Returned by a health check, not by a request: it served nothing meanwhile.
        assert back.served == 0 and back.in_flight == 0 and back.failures >= down.failures
        # a has served none and b four: a takes the next request.
        again = await pool.generate(HELLO, max_tokens=4, temperature=0.0, seed=1)
        assert again.endpoint == "a" and again.attempts == ["a"]


async def test_a_refused_request_is_not_rerouted(servers: Servers) -> None:
    # Over the 1024-token context: llama-cpp-python answers 400, which any actor would.
    long = [{"role": "user", "content": "word " * 2000}]
    async with ActorPool(servers.config(("b", "c"))) as pool:
        with pytest.raises(ActorRequestError) as err:
            await pool.generate(long, max_tokens=4, temperature=0.0, seed=None)
        assert err.value.endpoint == "b" and err.value.status == 400
        assert [(s.healthy, s.failures) for s in pool.snapshot()] == [(True, 0), (True, 0)]


async def test_a_timeout_drains_the_endpoint_and_tries_the_next(servers: Servers) -> None:
    cfg = servers.config(("b", "c"), request_timeout_s=0.2, retry_dead_after_s=60)
    async with ActorPool(cfg) as pool:
        with pytest.raises(NoHealthyActor) as err:
            await pool.generate(HELLO, max_tokens=64, temperature=0.0, seed=None)
        assert err.value.attempts == ["b", "c"]
        assert "no answer in 0.2s" in str(err.value)
        for s in pool.snapshot():
            assert not s.healthy and s.failures == 1 and s.last_error == "no answer in 0.2s"
    # The servers are still running the abandoned generations (llama-cpp-python does not
    # stop on a disconnect). Busy is not dead: a new pool finds both healthy, and its
    # requests wait their turn, so later tests find the servers idle.
    async with ActorPool(servers.config(("b", "c"))) as pool:
        assert [s.healthy for s in pool.snapshot()] == [True, True]
        gens = await asyncio.gather(
            *(pool.generate(HELLO, max_tokens=1, temperature=0.0, seed=None) for _ in "bc")
        )
        assert sorted(g.endpoint for g in gens) == ["b", "c"]
