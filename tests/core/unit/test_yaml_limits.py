"""``keel.yaml_limits``: depth and node counts with aliases expanded, counted exactly."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from keel.yaml_limits import BoundedComposerMixin, YamlLimitError


class Small(BoundedComposerMixin, yaml.SafeLoader):
    max_depth = 3
    max_nodes = 10


def load(text: str) -> Any:
    loader = Small(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def refusal(text: str) -> tuple[str, int, int]:
    with pytest.raises(YamlLimitError) as info:
        load(text)
    return info.value.message, info.value.line, info.value.column


def test_an_alias_counts_as_every_node_it_names():
    # map, key a, list, 1, 2, key b, and *x standing for the list of three: 9 nodes.
    assert load("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}
    assert refusal("a: &x [1, 2]\nb: *x\nc: 1\n") == ("more than 10 nodes", 2, 3)
    assert refusal("a: &x [1, 2]\nb: *x\nc: *x\n")[0] == (
        "more than 10 nodes once aliases are expanded (alias *x stands for 3)"
    )


def test_depth_counts_levels_and_the_levels_an_alias_brings():
    assert load("[[1]]") == [[1]]
    assert refusal("[[[1]]]") == ("nesting deeper than 3 levels", 0, 3)
    assert refusal("- - - 1\n") == ("nesting deeper than 3 levels", 0, 6)
    assert load("a: &x 1\nb: [*x]\n") == {"a": 1, "b": [1]}
    assert refusal("a: &x [1]\nb: [*x]\n") == (
        "nesting deeper than 3 levels once alias *x is expanded",
        1,
        4,
    )


def test_an_alias_inside_what_it_names_is_refused():
    assert refusal("&x [*x]") == ("alias *x is used inside the node it names", 0, 4)
