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
            # Async subprocess: this test's in-process worker keeps polling meanwhile.
            proc = await asyncio.create_subprocess_exec(
                find_binary("st"), "run", f"http://127.0.0.1:{port}/openapi.json",
                "--checks", "not_a_server_error", "--max-examples", "15", "--seed", "7",
                "--phases", "coverage,fuzzing", "--suppress-health-check", "all",
                "-H", f"Authorization: Bearer {token(actor)}", "--request-timeout", "30",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            out, _ = await asyncio.wait_for(proc.communicate(), 600)
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
