import shutil
from pathlib import Path

import pytest

from keel.rllm import (
    DependencyResolutionError,
    ResolvedApp,
    merge_output,
    parse_text,
    resolve,
)
from store.files import load_rllm, load_rllm_app

EXAMPLES = Path(__file__).parents[3] / "examples"
COMPOSE = Path(__file__).parent / "rllm_golden" / "compose"


def test_composition_example_resolves_with_a_typed_merged_contract(monkeypatch):
    monkeypatch.chdir(EXAMPLES)
    app = load_rllm_app("compose_summary_keywords.rllm")
    g = app.graph
    assert g.root == "compose_summary_keywords.rllm"
    assert g.order() == ["summary.rllm", "extract_keywords.rllm", "compose_summary_keywords.rllm"]
    assert [(e.alias, e.child, e.exposes, e.after) for e in g.children(g.root)] == [
        ("summarised", "summary.rllm", ["summary"], []),
        ("keywords_of", "extract_keywords.rllm", ["keywords"], []),
    ]
    assert not g.nodes[g.root].needs_llm
    assert g.nodes["summary.rllm"].needs_llm
    # The parent's output contract is fed field by field from the children's.
    root = app.root
    for name, ref in root.output_map.items():
        alias, field = ref.split(".")
        edge = next(e for e in g.edges if e.alias == alias)
        child_schema = app.child(edge).output_schema["properties"][field]
        assert child_schema["type"] == root.output_schema["properties"][name]["type"]
    assert app.child(g.edges[0]).source_path == "summary.rllm"
    assert ResolvedApp.model_validate_json(app.model_dump_json()) == app


def test_graph_digest_follows_every_file(tmp_path):
    for name in ("summary", "extract_keywords", "compose_summary_keywords"):
        shutil.copy(EXAMPLES / f"{name}.rllm", tmp_path)
    before = load_rllm_app(tmp_path / "compose_summary_keywords.rllm").graph.digest()
    assert before == load_rllm_app(tmp_path / "compose_summary_keywords.rllm").graph.digest()
    child = tmp_path / "summary.rllm"
    child.write_text(child.read_text().replace("author: Keel", "author: Someone"))
    assert load_rllm_app(tmp_path / "compose_summary_keywords.rllm").graph.digest() != before


def test_chained_children_and_a_shared_child(monkeypatch):
    monkeypatch.chdir(COMPOSE)
    app = load_rllm_app("chained.rllm")
    g = app.graph
    assert sorted(g.nodes) == ["chained.rllm", "child.rllm"]
    assert [(e.alias, e.input_map, e.after) for e in g.edges] == [
        ("first", {"text": "text"}, []),
        ("second", {"text": "first.answer"}, ["first"]),
    ]
    assert g.order() == ["child.rllm", "chained.rllm"]
    out = merge_output(app.root, None, {"first": {"answer": "a"}, "second": {"answer": "b"}})
    assert out == {"answer": "b", "draft": "a"}


def test_cycle_names_its_path(monkeypatch):
    monkeypatch.chdir(COMPOSE)
    with pytest.raises(DependencyResolutionError) as info:
        load_rllm_app("cycle_b.rllm")
    assert info.value.details["cycle"] == [
        "cycle_b.rllm",
        "nested/cycle_c.rllm",
        "cycle_a.rllm",
        "cycle_b.rllm",
    ]


def test_self_use_is_a_cycle(tmp_path):
    base = (COMPOSE / "child.rllm").read_text()
    me = tmp_path / "me.rllm"
    me.write_text(
        base.replace(
            "llm: {provider",
            "uses:\n  - path: me.rllm\n    alias: again\n    exposes: [answer]\n"
            "    input_map: {text: text}\nllm: {provider",
        )
    )
    with pytest.raises(DependencyResolutionError, match=r"me.rllm -> me.rllm"):
        load_rllm_app(me)


def test_text_without_path_cannot_resolve_uses():
    text = (EXAMPLES / "compose_summary_keywords.rllm").read_text()
    program = parse_text(text)
    with pytest.raises(DependencyResolutionError, match="relative to the app's file"):
        resolve(program, loader=load_rllm)
    app = resolve(program, path=EXAMPLES / "compose_summary_keywords.rllm", loader=load_rllm)
    assert len(app.graph.nodes) == 3
    lone = resolve(load_rllm(EXAMPLES / "summary.rllm"), loader=load_rllm)
    assert lone.graph.order() == ["summary.rllm"] and lone.graph.edges == []


def test_child_error_is_wrapped_with_its_cause(monkeypatch):
    monkeypatch.chdir(COMPOSE)
    with pytest.raises(DependencyResolutionError) as info:
        load_rllm_app("broken_child.rllm")
    cause = info.value.details["cause"]
    assert cause["error_type"] == "ParseError"
    assert cause["details"]["variable"] == "txt"
