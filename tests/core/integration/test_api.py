"""The HTTP API as a whole against the real dev server: health, error shape, fuzz."""

from __future__ import annotations

import asyncio
import sys

import pytest

from services.processes import ManagedProcess, find_binary, free_port
from tests.support.api import TOKENS, assert_error, auth, token


async def test_health(http):
    resp = await http.get("/health")
    assert resp.json() == {"status": "ok", "temporal": True}


@pytest.mark.slow
@pytest.mark.timeout(600)  # two schemathesis runs of up to 200 s each (78 s in all here)
async def test_openapi_fuzz_has_no_server_errors(api_settings, temporal_address, worker, tmp_path):
    """schemathesis against a live `keel api` process: no 5xx for any generated request."""
    port = free_port()
    env = {
        "KEEL_TEMPORAL_ADDRESS": temporal_address,
        "KEEL_API_PORT": str(port),
        "KEEL_DATA_DIR": str(api_settings.data_dir),
        "KEEL_TASK_QUEUE": api_settings.task_queue,
        "KEEL_API_TOKENS": "["
        + ",".join(
            f'{{"token":"{token(a)}","actor":"{a}","roles":{list(r)!r}}}'.replace("'", '"')
            for a, r in TOKENS.items()
        )
        + "]",
    }
    server = ManagedProcess(
        "api", [sys.executable, "-m", "cli.keel", "api"], tmp_path / "api.log", env=env
    )
    server.start()
    try:
        await asyncio.to_thread(server.wait_port, port, 60)
        for actor in ("bob", "alice"):
            # Async subprocess: this test's in-process worker keeps polling meanwhile. The
            # SSE stream is left out: a stream of a run still going ends only with the run,
            # and its pings (every 10 s) keep schemathesis' per-read timeout from firing; a
            # stream of a run the fuzzer started could hold it for minutes (a suite run here
            # timed out at 300 s). tests/design/integration/test_api.py covers the stream.
            proc = await asyncio.create_subprocess_exec(
                find_binary("st"), "run", f"http://127.0.0.1:{port}/openapi.json",
                "--checks", "not_a_server_error", "--max-examples", "15", "--seed", "7",
                "--phases", "coverage,fuzzing", "--suppress-health-check", "all",
                "--exclude-path", "/design/streams/{decision_set_id}",
                "-H", f"Authorization: Bearer {token(actor)}", "--request-timeout", "30",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            out = bytearray()

            async def drain(proc: asyncio.subprocess.Process = proc, out: bytearray = out) -> None:
                assert proc.stdout is not None
                while chunk := await proc.stdout.read(65536):
                    out.extend(chunk)
                await proc.wait()

            try:
                await asyncio.wait_for(drain(), 200)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                pytest.fail(f"schemathesis ran past 200 s:\n{out.decode()[-6000:]}")
            assert proc.returncode == 0, out.decode()[-6000:]
    finally:
        server.stop()


async def test_a_body_that_is_not_json_is_400_and_documented(http):
    resp = await http.post(
        "/gates",
        content=b"{not json",
        headers={**auth("alice"), "Content-Type": "application/json"},
    )
    assert_error(resp, 400, "bad_request")
    # JSON that breaks the schema stays a 422.
    assert_error(
        await http.post("/gates", json={"name": 5}, headers=auth("alice")), 422, "validation_failed"
    )
    # An empty Idempotency-Key is refused before anything runs.
    resp = await http.post(
        "/gates", json={"name": "x"}, headers={**auth("alice"), "Idempotency-Key": ""}
    )
    assert_error(resp, 422, "validation_failed")

    doc = (await http.get("/openapi.json")).json()
    for path in ("/gates", "/mrp/jobs", "/rllm/runs"):
        post = doc["paths"][path]["post"]
        assert "400" in post["responses"], path
        (key,) = [p for p in post["parameters"] if p["name"] == "Idempotency-Key"]
        assert key["schema"]["anyOf"][0]["minLength"] == 1, key
    rules = doc["components"]["schemas"]["SubmitJobBody"]["description"]
    assert "exactly one of `job_yaml` and `path`" in rules
    assert "`base_dir` goes with `job_yaml`" in rules
