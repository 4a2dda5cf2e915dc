"""Property-based fuzz of both parsers: whatever the text, the ``.rllm`` parser raises only
``RllmError`` subclasses and the MRP DSL parser only ``DslError`` (issue 14).

Three kinds of input: any text; text stitched from YAML and ``.rllm`` syntax (brackets,
anchors, aliases, tags, merge keys, section headers, template braces); and a valid file
with such a fragment spliced in at any position, so the parsers get past the first line.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel.mrp.dsl import parse_job
from keel.mrp.errors import DslError
from keel.rllm import parse_text
from keel.rllm.errors import RllmError
from tests.mrp.unit.mrp_jobs import job_text

RLLM_BASE = (
    Path(__file__).parents[2] / "rllm" / "unit" / "rllm_golden" / "tiny_base.rllm"
).read_text()
MRP_BASE = job_text("valid/wordcount.yaml")

TOKENS = [
    "[", "]", "{", "}", ":", ": ", ", ", " ", "  ", "\n", "\n  ", "- ", "? ", "|", ">",
    "&a ", "*a", "&b ", "*b", "!!str ", "!!map ", "!!python/object:os.system ", "!x ",
    "<<: ", "'", '"', "# c", "---", "...", "%YAML 1.1", "\t", "\\", "\x00", "\ufeff",
    "key", "name", "uses", "metadata", "input_schema", "type", "object", "properties",
    "1", "-1", "1.5", ".nan", ".inf", "0x1F", "2024-01-01", "true", "null", "~", "1e400",
    "=== recovery ===", "=== python name=p stage=pre inputs=text outputs=x ===",
    "{{ text }}", "{{ rllm.errors }}", "{{", "}}", "\\{{", "x = (", "dsl_version",
    "inputs", "items", "files", "map", "operator", "policy", "a@1.0.0", "../x",
]  # fmt: skip

FUZZ = settings(
    max_examples=int(os.environ.get("KEEL_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=30,
)
yamlish = st.lists(st.sampled_from(TOKENS), max_size=60).map("".join)
fragments = yamlish | st.text(max_size=40) | json_values.map(yaml.safe_dump)


@st.composite
def spliced(draw: st.DrawFn, base: str) -> str:
    at = draw(st.integers(0, len(base)))
    cut = draw(st.integers(0, 20))
    return base[:at] + draw(fragments) + base[at + cut :]


def parse_rllm(text: str) -> None:
    with contextlib.suppress(RllmError):
        parse_text(text, path="fuzz.rllm")


def parse_mrp(text: str) -> None:
    with contextlib.suppress(DslError):
        parse_job(text, "fuzz.yaml")


@FUZZ
@given(st.text() | yamlish)
def test_rllm_parser_on_any_text(text: str) -> None:
    parse_rllm(text)
    parse_rllm("---\n" + text + "\n---\n{{ text }}\n")


@FUZZ
@given(spliced(RLLM_BASE))
def test_rllm_parser_on_a_damaged_file(text: str) -> None:
    parse_rllm(text)


@FUZZ
@given(json_values)
def test_rllm_parser_on_any_frontmatter_value(value: object) -> None:
    parse_rllm("---\n" + yaml.safe_dump(value) + "---\n{{ text }}\n")


@FUZZ
@given(st.text() | yamlish | json_values.map(yaml.safe_dump))
def test_mrp_parser_on_any_text(text: str) -> None:
    parse_mrp(text)


@FUZZ
@given(spliced(MRP_BASE))
def test_mrp_parser_on_a_damaged_file(text: str) -> None:
    parse_mrp(text)
