"""The CLI toolkit: one exit-code table, one error model written in each family's shape,
and the start-and-watch race."""

from __future__ import annotations

import asyncio
import json

import pytest

from cli import toolkit
from cli.envelope import CliError
from cli.toolkit import CliFailure
from client import waiting
from keel.rllm.errors import ERROR_CLASSES
from keel.rllm.failures import (
    INTERNAL_ERROR_CODE,
    INTERNAL_EXIT_CODE,
    USAGE_ERROR_CODE,
    USAGE_EXIT_CODE,
)


def test_rllm_exit_codes_are_the_error_classes_codes() -> None:
    expected = {cls.error_code: cls.exit_code for cls in ERROR_CLASSES}
    expected |= {INTERNAL_ERROR_CODE: INTERNAL_EXIT_CODE, USAGE_ERROR_CODE: USAGE_EXIT_CODE}
    table = dict(toolkit.EXIT_CODES["rllm"])
    assert table.pop("ok") == 0
    assert table == expected


def test_every_family_has_a_style_and_distinct_named_codes() -> None:
    assert set(toolkit.ERROR_STYLES) == set(toolkit.EXIT_CODES)
    for family, table in toolkit.EXIT_CODES.items():
        assert table["ok"] == 0, family
        assert len(set(table.values())) == len(table), family


def test_envelope_family_writes_the_error_in_json_mode(capsys: pytest.CaptureFixture[str]) -> None:
    toolkit.output.json = True
    failure = CliFailure("mrp", "refused", ["job.yaml:3: MRP-P001 over cap", "second"], details=[1])
    assert toolkit.report(failure.error) == 4
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc == {
        "error": {
            "family": "mrp",
            "type": "refused",
            "code": "refused",
            "message": "job.yaml:3: MRP-P001 over cap; second",
            "exit_code": 4,
            "details": [1],
        }
    }
    assert err == "error: job.yaml:3: MRP-P001 over cap\nerror: second\n"


def test_envelope_family_writes_only_stderr_in_text_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    toolkit.output.json = False
    assert toolkit.report(CliFailure("mrp", "not_found", "no MRP run 'x'").error) == 7
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "error: no MRP run 'x'\n"


def test_payload_family_writes_its_payload_and_the_hint_for_people(
    capsys: pytest.CaptureFixture[str],
) -> None:
    payload = {"error_code": "RLLM_RETRY_EXHAUSTED", "message": "gave up"}
    err = CliError(
        family="rllm", type="RLLM_RETRY_EXHAUSTED", message="gave up", exit_code=16,
        details=payload, lines=["RetryExhaustedError: gave up"], hint="raise max_retries",
    )  # fmt: skip
    toolkit.output.json = True
    assert toolkit.report(err) == 16
    out, stderr = capsys.readouterr()
    assert out == json.dumps(payload) + "\n"
    assert stderr == "error: RetryExhaustedError: gave up\n"
    toolkit.output.json = False
    toolkit.report(err)
    out, stderr = capsys.readouterr()
    assert json.loads(out) == payload and out.count("\n") > 1  # indented for people
    assert stderr.endswith("hint: raise max_retries\n")


async def test_wait_watching_returns_the_result_and_stops_the_watcher() -> None:
    stopped = asyncio.Event()

    async def watch() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()

    async def result() -> str:
        await asyncio.sleep(0.01)
        return "done"

    assert await waiting.wait_watching(result(), watch()) == "done"
    assert stopped.is_set()


async def test_a_dead_service_ends_the_wait_with_the_family_failure() -> None:
    class Services:
        def dead(self) -> str | None:
            return "the worker this command started exited"

    never = asyncio.get_running_loop().create_future()
    watch = waiting.watch_services(
        Services(), on_dead=lambda why: CliFailure("mrp", "error", why), interval_s=0.01
    )
    with pytest.raises(CliFailure, match="the worker this command started exited"):
        await waiting.wait_watching(never, watch)
    assert never.cancelled()
