"""DSL v0.1: validation, unknown fields and YAML problems reported with key paths and lines."""

from __future__ import annotations

import pytest

from keel.mrp.dsl import (
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    JobSpec,
    load_yaml_with_lines,
    parse_job,
    split_ref,
)
from keel.mrp.errors import DslError
from tests.mrp.unit.mrp_jobs import job_text

BASE = job_text("valid/wordcount.yaml")


def issues_of(text: str) -> list[tuple[str, int | None, str]]:
    with pytest.raises(DslError) as info:
        parse_job(text, source="job.yaml")
    return [(i.path, i.line, i.message) for i in info.value.issues]


def test_valid_job_parses_with_defaults():
    parsed = parse_job(BASE)
    spec = parsed.spec
    assert spec.job_id == "wordcount-demo"
    assert spec.inputs.items_per_shard == 2
    assert spec.operator_refs() == {
        "map": "tokens-count@1.0.0",
        "produce": "json-writer@1.0.0",
        "reduce": "sum-counts@1.0.0",
    }
    assert spec.evaluator is None and spec.approval is None
    assert parsed.lines["map.operator"] == 14
    assert parsed.lines["inputs.items[2]"] == 9


def test_unknown_fields_point_at_their_lines():
    text = job_text("valid/wordcount.yaml").replace(
        "  params:\n    lowercase: true\n", "  parms:\n    lowercase: true\n"
    )
    text = text.replace("policy:\n", "retries: 3\npolicy:\n")
    issues = issues_of(text)
    assert ("map.parms", 15, "unknown field 'parms'; did you mean 'params'?") in issues
    assert ("retries", 24, "unknown field 'retries'") in issues
    assert len(issues) == 2


def test_unknown_field_in_nested_sink_and_message_renders_file_and_line():
    text = BASE.replace("    kind: json\n", "    kind: json\n    mode: append\n")
    with pytest.raises(DslError) as info:
        parse_job(text, source="wordcount.yaml")
    assert "wordcount.yaml:23: produce.sink.mode: unknown field 'mode'" in str(info.value)


def test_missing_field_points_at_its_parent():
    text = BASE.replace("  operator: sum-counts@1.0.0\n", "  params: {}\n")
    assert issues_of(text) == [("reduce.operator", 17, "required field is missing")]


def test_unpinned_operator_names_the_key():
    text = BASE.replace("tokens-count@1.0.0", "tokens-count")
    [(path, line, message)] = issues_of(text)
    assert (path, line) == ("map.operator", 14)
    assert "must be pinned as name@version" in message


def test_type_errors_and_bad_values_each_get_a_line():
    text = (
        BASE.replace("max_workers: 4", 'max_workers: "4"')
        .replace("destination: out/wordcount.json", "destination: ../escape.json")
        .replace("kind: json", "kind: csv")
    )
    issues = {(p, line) for p, line, _ in issues_of(text)}
    assert issues == {
        ("policy.max_workers", 25),
        ("produce.sink.destination", 23),
        ("produce.sink.kind", 22),
    }


def test_nan_in_items_is_refused_at_the_item():
    text = BASE.replace('{id: 3, text: "Too loud"}', '{id: 3, text: "Too loud", score: .nan}')
    [(path, line, message)] = issues_of(text)
    assert (path, line) == ("inputs.items[2]", 9)
    assert "NaN" in message


def test_inputs_need_exactly_one_source_and_one_sharding_mode():
    text = BASE.replace("  shard_size: 2\n", "  shard_size: 2\n  by: item\n")
    [(path, line, message)] = issues_of(text)
    assert (path, line) == ("inputs", 5)
    assert message == "give exactly one of 'shard_size' or 'by: item'"
    text = BASE.replace("  shard_size: 2\n", "  shard_size: 2\n  files: [a.jsonl]\n")
    assert issues_of(text)[0][2] == "give exactly one of 'items' or 'files'"


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        ("/etc/passwd", "must be relative"),
        ("data/../secret", "must not contain '..'"),
        ("./data/*.jsonl", "must be written as 'data/*.jsonl'"),
        ("data\\x.jsonl", "must use '/' separators"),
    ],
)
def test_file_patterns_stay_under_the_root(pattern: str, fragment: str):
    text = job_text("valid/files.yaml").replace("- data/reviews/*.jsonl", f"- '{pattern}'")
    [(path, line, message)] = issues_of(text)
    assert (path, line) == ("inputs.files[0]", 6)
    assert fragment in message


def test_policy_needs_a_budget():
    text = BASE.replace('  budget_units: "10"\n  budget_usd: "1.00"\n', "")
    assert issues_of(text) == [
        ("policy", 24, "give 'budget_usd' or 'budget_units' (or both)"),
    ]


def test_unquoted_dsl_version_is_explained():
    [(path, line, message)] = issues_of(BASE.replace('dsl_version: "0.1"', "dsl_version: 0.1"))
    assert (path, line) == ("dsl_version", 2)
    assert message == 'dsl_version must be a quoted string, e.g. dsl_version: "0.1"'
    [(_, _, message)] = issues_of(BASE.replace('dsl_version: "0.1"', 'dsl_version: "9.9"'))
    assert message.startswith("unsupported dsl_version '9.9'")


def test_bad_job_id_is_refused():
    [(path, _, message)] = issues_of(BASE.replace("job_id: wordcount-demo", "job_id: Word Count"))
    assert path == "job_id"
    assert "lowercase" in message


def test_duplicate_keys_are_errors_not_last_one_wins():
    text = BASE.replace("  max_workers: 4\n", "  max_workers: 4\n  max_workers: 8\n")
    assert issues_of(text) == [("", 26, "duplicate key 'max_workers' (first on line 25)")]


def test_non_string_keys_are_refused():
    # YAML 1.1 reads an unquoted `on` as true; a key must be text.
    text = BASE.replace("  params:\n    lowercase: true\n", "  params:\n    on: true\n")
    assert issues_of(text) == [("", 16, "mapping keys must be strings")]


def test_dates_stay_strings():
    data, _ = load_yaml_with_lines("when: 2026-01-02\nat: 2026-01-02T03:04:05Z\n")
    assert data == {"when": "2026-01-02", "at": "2026-01-02T03:04:05Z"}


def test_yaml_syntax_error_has_a_line():
    [(path, line, message)] = issues_of(BASE.replace("  shard_size: 2\n", "  shard_size: [2\n"))
    assert path == "" and line is not None and line >= 12
    assert "flow sequence" in message


def test_alias_bomb_is_refused_before_expanding():
    rows = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i, name in enumerate("bcdefg"):
        prev = "abcdefg"[i]
        rows.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    issues = issues_of("\n".join(rows) + "\n")
    assert issues[0][2].startswith(
        f"document exceeds a limit: more than {MAX_YAML_NODES} nodes once aliases are expanded"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "job file is empty"), ("- 1\n- 2\n", "a job file must be a YAML mapping")],
)
def test_empty_and_non_mapping_documents(text: str, message: str):
    assert issues_of(text) == [("", 1, message)]


def test_canonical_lists_in_the_spec():
    text = job_text("valid/sentiment.yaml")
    spec = parse_job(text).spec
    assert spec.approval is not None
    assert spec.approval.approvers == ["alice", "bob"]
    assert spec.policy.allowed_operators == sorted(spec.policy.allowed_operators or [])


def test_spec_is_frozen():
    spec: JobSpec = parse_job(BASE).spec
    with pytest.raises(ValueError):
        spec.job_id = "other"  # type: ignore[misc]


@pytest.mark.parametrize("ref", ["x", "x@1", "x@1.0", "X@1.0.0", "x@v1.0.0", "x@latest"])
def test_refs_must_be_exact_versions(ref: str):
    with pytest.raises(ValueError):
        split_ref(ref)


def test_ref_split():
    assert split_ref("llm.classify@1.2.3-rc.1") == ("llm.classify", "1.2.3-rc.1")


def test_json_schema_export_refuses_unknown_fields_too():
    schema = JobSpec.model_json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {
        "dsl_version",
        "job_id",
        "inputs",
        "map",
        "reduce",
        "produce",
        "policy",
    }
    models = {k: v for k, v in schema["$defs"].items() if k.endswith("Spec")}
    assert len(models) == 8
    assert all(d["additionalProperties"] is False for d in models.values())


def test_deep_nesting_is_refused_with_its_line_not_a_recursion_error():
    text = BASE + "extra:\n  deep: " + "[" * 50_000 + "]" * 50_000 + "\n"
    [(path, line, message)] = issues_of(text)
    assert path == ""
    assert message == f"document exceeds a limit: nesting deeper than {MAX_YAML_DEPTH} levels"
    assert line == BASE.count("\n") + 2


def test_alias_nested_deeper_than_the_limit_and_alias_cycles_are_refused():
    deep = "[" * (MAX_YAML_DEPTH - 2) + "]" * (MAX_YAML_DEPTH - 2)
    issues = issues_of(f"a: &x {deep}\nb: [[[*x]]]\n")
    assert issues == [
        ("", 2, f"document exceeds a limit: nesting deeper than {MAX_YAML_DEPTH} levels once "
         "alias *x is expanded")
    ]  # fmt: skip
    assert issues_of("a: &x [1, *x]\n") == [
        ("", 1, "document exceeds a limit: alias *x is used inside the node it names")
    ]


def test_unprintable_characters_are_a_dsl_error():
    assert issues_of("a: 1\nb: \x00\n")[0][:2] == ("", 2)
