"""Map shards go to their operator host a batch at a time (``run_map_batch_in_host``): one
pipe round trip and one check of the operator handle per batch. Each shard still gets its
own context (seed, shard id, charged units, logs, LLM and file proxies that answer for
it), its own failure, its own memory limit, and a shard that kills its host fails alone.

The operator is a copy of ``memory-hog`` (tests/mrp/operators) extended with shards that
raise, that exit their process, that charge units and read a file, re-signed with the dev
key in a temp folder, so it runs in real host processes like any signed operator.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator

import pytest
import yaml
from pydantic import JsonValue

from activities.mrp.host import run_map_batch_in_host, stop_hosts
from activities.mrp.operators import (
    DEV_KEY_PATH,
    DEV_PUBLIC_KEY,
    OperatorHandle,
    load_mrp_config,
    load_private_key,
    sign_operator,
)
from keel.mrp.normalize import FileRef
from keel.mrp.sdk import OperatorContext, OperatorError
from tests.mrp.operators import HERE as TEST_OPERATORS

AGENT = """
from __future__ import annotations

import os

from pydantic import JsonValue

from keel.mrp.sdk import AgentBase, OperatorContext, OperatorError


class Batchy(AgentBase):
    def map(self, items: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        p = ctx.params
        if ctx.shard_id in (p.get("die_shards") or []):
            os._exit(3)
        if ctx.shard_id in (p.get("bad_shards") or []):
            raise OperatorError(ctx.operator, f"bad shard {ctx.shard_id}", retryable=False)
        if ctx.shard_id in (p.get("hog_shards") or []):
            block = bytearray(int(p.get("mb", 64)) * 1024 * 1024)
            for i in range(0, len(block), 4096):
                block[i] = 1
            del block
        read = b""
        if ctx.shard_id in (p.get("read_shards") or []):
            read = ctx.read_file({"path": "f", "digest": str(items[0]), "size_bytes": 5})
        ctx.charge(ctx.seed)
        ctx.log(f"{ctx.shard_id} seed {ctx.seed} pid {os.getpid()}")
        return {"items": len(items), "chars": ctx.seed * 1000 + len(read)}
"""

PARAMS_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "mb": {"type": "integer", "minimum": 1},
        **{
            k: {"type": "array", "items": {"type": "string"}}
            for k in ("hog_shards", "die_shards", "bad_shards", "read_shards")
        },
    },
}


@pytest.fixture(scope="module")
def handle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorHandle]:
    root = tmp_path_factory.mktemp("ops")
    folder = root / "batchy"
    shutil.copytree(
        TEST_OPERATORS / "memory_hog", folder, ignore=shutil.ignore_patterns("__pycache__")
    )
    (folder / "agent.py").write_text(AGENT, encoding="utf-8")
    spec = yaml.safe_load((folder / "operator.yaml").read_text(encoding="utf-8"))
    spec.update(name="batchy", entrypoint="agent:Batchy", params_schema=PARAMS_SCHEMA)
    spec.pop("signature", None)
    (folder / "operator.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    sign_operator(folder, load_private_key(DEV_KEY_PATH))
    config = root / "mrp.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "operator_paths": [str(root)],
                "trusted_keys": {"keel-dev": DEV_PUBLIC_KEY},
                "allow": ["batchy@1.0.0"],
                "caps": {"require_signatures": True, "max_shard_memory_mb": 4096},
            }
        ),
        encoding="utf-8",
    )
    yield load_mrp_config(path=config).handle("batchy@1.0.0")
    stop_hosts()


def contexts(
    n: int, params: dict[str, JsonValue], files: dict[str, bytes] | None = None
) -> list[tuple[object, OperatorContext]]:
    def reader(i: int) -> Callable[[FileRef], bytes]:
        def read(ref: FileRef) -> bytes:  # each shard's reader answers its own bytes
            assert files is not None
            return files[ref.digest] * (i + 1)

        return read

    return [
        (
            [f"item-{i}"] if not files else [next(iter(files))],
            OperatorContext(
                params=dict(params),
                seed=i + 1,
                shard_id=f"shard-{i:06d}",
                operator="batchy@1.0.0",
                file_reader=reader(i),
            ),
        )
        for i in range(n)
    ]


def test_each_shard_of_a_batch_has_its_own_seed_charge_and_logs(handle: OperatorHandle) -> None:
    shards = contexts(6, {})
    out = run_map_batch_in_host(handle, shards)
    assert [o[0] for o in out] == [{"items": 1, "chars": (i + 1) * 1000} for i in range(6)]  # type: ignore[index]
    pids = set()
    for i, (_, ctx) in enumerate(shards):
        assert ctx.charged_units == i + 1
        (line,) = ctx.logs
        assert line.startswith(f"shard-{i:06d} seed {i + 1} pid ")
        pids.add(line.rsplit(" ", 1)[1])
    assert len(pids) == 1, "one host served the whole batch"
    assert str(os.getpid()) not in pids


def test_a_failing_shard_fails_alone_and_the_batch_goes_on(handle: OperatorHandle) -> None:
    out = run_map_batch_in_host(handle, contexts(5, {"bad_shards": ["shard-000002"]}))
    assert isinstance(out[2], OperatorError) and "bad shard shard-000002" in str(out[2])
    assert out[2].retryable is False
    assert [o[0] for i, o in enumerate(out) if i != 2] == [  # type: ignore[index]
        {"items": 1, "chars": s * 1000} for s in (1, 2, 4, 5)
    ]


def test_a_shard_that_kills_its_host_fails_alone(handle: OperatorHandle) -> None:
    out = run_map_batch_in_host(handle, contexts(5, {"die_shards": ["shard-000003"]}))
    assert isinstance(out[3], OperatorError)
    assert "exited (code 3)" in str(out[3]) and out[3].retryable
    ok = [i for i, o in enumerate(out) if not isinstance(o, OperatorError)]
    assert ok == [0, 1, 2, 4]
    assert [out[i][0]["chars"] for i in ok] == [1000, 2000, 3000, 5000]  # type: ignore[index]


def test_a_shard_over_its_memory_limit_fails_alone_and_the_rest_run_in_a_new_host(
    handle: OperatorHandle,
) -> None:
    shards = contexts(4, {"hog_shards": ["shard-000001"], "mb": 256})
    out = run_map_batch_in_host(handle, shards, memory_mb=64)
    assert isinstance(out[1], OperatorError)
    assert "memory limit of 64 MB" in str(out[1]) and not out[1].retryable
    assert [out[i][0]["chars"] for i in (0, 2, 3)] == [1000, 3000, 4000]  # type: ignore[index]
    pid = lambda i: shards[i][1].logs[0].rsplit(" ", 1)[1]  # noqa: E731
    assert pid(0) != pid(2) == pid(3), "the host that ran out of memory was not used again"
    # Under a limit that fits, the same shard succeeds in the same batch shape.
    out = run_map_batch_in_host(
        handle, contexts(4, {"hog_shards": ["shard-000001"], "mb": 16}), memory_mb=64
    )
    assert not any(isinstance(o, OperatorError) for o in out)


def test_file_reads_are_answered_for_the_shard_that_asked(handle: OperatorHandle) -> None:
    files = {"blake3:" + "ab" * 32: b"hello"}
    shards = contexts(3, {"read_shards": ["shard-000001"]}, files)
    out = run_map_batch_in_host(handle, shards)
    # Shard 1's read was answered by shard 1's reader (its bytes twice over).
    assert [o[0]["chars"] for o in out] == [1000, 2010, 3000]  # type: ignore[index]
