"""Test-only MRP operators for fault tests (flaky, slow, expensive), signed with the dev key.

Load them through ``tests/support/mrp_operators/mrp.yaml`` (operator paths: the shipped
``operators/`` and this folder). They are imported from their folders by path
(``activities.mrp.operators.load_operator``), so Ray workers need
nothing but the repository on their path.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
TEST_CONFIG = HERE / "mrp.yaml"
