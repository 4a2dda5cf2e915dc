"""The two-node Ray cluster test's fixture (tests/mrp/integration/test_ray_cluster.py)
turns a cluster that cannot start into a red test, never a skip: CI has Ray, so a skip
there would be a test that never ran, counted green.

The fixture is run for real, in a pytest run of its own (pytester), with a ``ray`` that
exits 1 at once in place of the node launcher (``KEEL_TEST_RAY``,
tests/support/ray_cluster.py): every attempt fails in a second instead of minutes.
"""

from __future__ import annotations

import pytest

from tests.support.ray_cluster import RAY_COMMAND_ENV, ray_command

pytest_plugins = ["pytester"]

BROKEN_RAY = """#!/bin/sh
echo "ray: this ray is broken on purpose ($*)" >&2
exit 1
"""

USES_THE_FIXTURE = """
from tests.mrp.integration.test_ray_cluster import ray_cluster  # the fixture itself


def test_needs_the_cluster(ray_cluster):
    raise AssertionError("the test body ran without a cluster")
"""


def test_a_cluster_that_cannot_start_is_an_error_not_a_skip(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = pytester.mkdir("bin")
    ray = bin_dir / "ray"
    ray.write_text(BROKEN_RAY)
    ray.chmod(0o755)
    monkeypatch.setenv(RAY_COMMAND_ENV, str(ray))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # none is needed
    assert ray_command() == [str(ray)]
    pytester.makepyfile(test_cluster=USES_THE_FIXTURE)

    result = pytester.runpytest()

    result.assert_outcomes(errors=1)  # passed, failed and skipped: 0
    result.stdout.fnmatch_lines(
        [
            "*Ray could not start the two-node test cluster on this host:*",
            "*attempt 3: ray node head exited:*",
        ]
    )
    result.stdout.no_fnmatch_line("*the test body ran without a cluster*")
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_nodes_start_with_the_loopback_launcher_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(RAY_COMMAND_ENV, raising=False)
    assert ray_command()[1:] == ["-m", "tests.support.ray_loopback_node"]
