"""A YAML composer with limits on nesting depth and on nodes counted with aliases expanded.

PyYAML's composer recurses once per nesting level, so 50,000 nested brackets end in a
``RecursionError``; and an alias is one node in the composed graph but a whole subtree to
every walk over the data, so nine levels of "billion laughs" anchors are a few hundred
bytes that expand to 9**9 nodes. :class:`BoundedComposerMixin` counts while it composes,
before any recursion gets deep and before anything walks the data: each node adds one,
each alias adds the expanded size of what it names, and an alias inside the node it names
(a cycle, which no JSON value can be) is refused. Depth counts an alias as the depth of
what it names, so a walk that follows aliases never recurses deeper than the limit either.
"""

from __future__ import annotations

from typing import Any, NoReturn

import yaml
from yaml.events import AliasEvent
from yaml.nodes import Node


class YamlLimitError(yaml.YAMLError):
    """A document exceeds a limit; ``line`` and ``column`` are 0-based, like PyYAML's marks."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


class BoundedComposerMixin:
    """Mix in before a PyYAML loader class; set ``max_depth`` and ``max_nodes`` on the subclass.

    ``max_nodes`` bounds the expanded size of one document: the number of nodes a walk
    that follows every alias visits (mapping keys included).
    """

    max_depth: int = 64
    max_nodes: int = 100_000

    # Provided by PyYAML's Composer and Parser, which this class is mixed into.
    anchors: dict[str, Node]
    check_event: Any
    peek_event: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reset_limits()

    def _reset_limits(self) -> None:
        """The counts of a new document (a loader whose bases take no common ``__init__``
        calls this from its own)."""
        # id(anchored node) -> (its expanded size, its height in levels)
        self._sizes: dict[int, tuple[int, int]] = {}
        self._depth = 0
        self._expanded = 0
        # The deepest level reached so far inside the node being composed.
        self._deepest = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        depth = self._depth + 1
        if self.check_event(AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:
                known = self._sizes.get(id(target))
                if known is None:
                    self._refuse(f"alias *{event.anchor} is used inside the node it names", event)
                size, height = known
                self._expanded += size
                if self._expanded > self.max_nodes:
                    self._refuse(
                        f"more than {self.max_nodes} nodes once aliases are expanded "
                        f"(alias *{event.anchor} stands for {size})",
                        event,
                    )
                if depth + height - 1 > self.max_depth:
                    self._refuse(
                        f"nesting deeper than {self.max_depth} levels "
                        f"once alias *{event.anchor} is expanded",
                        event,
                    )
                self._deepest = max(self._deepest, depth + height - 1)
            node: Node = super().compose_node(parent, index)  # type: ignore[misc]
            return node
        event = self.peek_event()
        if depth > self.max_depth:
            self._refuse(f"nesting deeper than {self.max_depth} levels", event)
        self._expanded += 1
        if self._expanded > self.max_nodes:
            self._refuse(f"more than {self.max_nodes} nodes", event)
        before, outer_deepest = self._expanded, self._deepest
        self._depth = self._deepest = depth
        node = super().compose_node(parent, index)  # type: ignore[misc]
        if event.anchor is not None:
            self._sizes[id(node)] = (self._expanded - before + 1, self._deepest - depth + 1)
        self._depth = depth - 1
        self._deepest = max(outer_deepest, self._deepest)
        return node

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # The scanner looks up to 1024 characters ahead for a possible "[...]: value" key
        # and checks every open bracket each time, so refusing only in the composer still
        # costs a second on a line of brackets; every '[' or '{' is one node level anyway.
        if self.flow_level >= self.max_depth:  # type: ignore[attr-defined]
            mark = self.get_mark()  # type: ignore[attr-defined]
            raise YamlLimitError(
                f"nesting deeper than {self.max_depth} levels", mark.line, mark.column
            )
        super().fetch_flow_collection_start(token_class)  # type: ignore[misc]

    def _refuse(self, message: str, event: Any) -> NoReturn:
        mark = event.start_mark
        raise YamlLimitError(message, mark.line if mark else 0, mark.column if mark else 0)


class BoundedSafeLoader(BoundedComposerMixin, yaml.SafeLoader):
    """``yaml.SafeLoader`` with the default limits of :class:`BoundedComposerMixin`."""
