"""YAML read as data, with bounds: configs come from users and from run directories.

PyYAML's ``safe_load`` constructs no objects, but it still lets a few hundred bytes of
aliases stand for billions of nodes (expanded only when the config is dumped again), a
deep nesting exhaust Python's stack, and a repeated key silently keep its last value.
:func:`load_yaml` refuses all three with a one-line reason: nesting deeper than
:data:`MAX_DEPTH`, more than :data:`MAX_NODES` nodes once aliases are expanded, a key
given twice in one mapping.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DEPTH = 64
"""Deepest nesting of mappings and lists accepted (configs use fewer than ten)."""
MAX_NODES = 100_000
"""Most nodes accepted with every alias expanded."""
MAX_BYTES = 1 << 20
"""Largest YAML text accepted (the biggest shipped config is a few kB)."""

_MERGE = "tag:yaml.org,2002:merge"


class _Bounded(yaml.SafeLoader):
    """``SafeLoader`` that stops composing past :data:`MAX_DEPTH` and refuses repeated
    keys."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels (line "
                                 f"{mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if isinstance(key, ScalarNode) and key.tag != _MERGE:
                first = seen.setdefault((key.tag, key.value), key.start_mark.line + 1)
                if first != key.start_mark.line + 1:
                    raise ValueError(f"key {key.value!r} is given twice (lines {first} and "
                                     f"{key.start_mark.line + 1}); keep one")
        return super().construct_mapping(node, deep)


def _expanded(root: Node) -> None:
    """A ``ValueError`` unless ``root`` with its aliases expanded is a tree of at most
    :data:`MAX_NODES` nodes and :data:`MAX_DEPTH` levels (aliases share nodes, so both
    are counted once per node, in linear time)."""
    sizes: dict[int, tuple[int, int]] = {}
    active: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children: list[Node] = []
        if isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, SequenceNode):
            children = list(node.value)
        if done:
            active.discard(key)
            count = 1 + sum(sizes[id(c)][0] for c in children)
            depth = 1 + max((sizes[id(c)][1] for c in children), default=0)
            if count > MAX_NODES:
                raise ValueError(f"more than {MAX_NODES} values once its aliases are "
                                 "expanded")
            if depth > MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels once its aliases "
                                 "are expanded")
            sizes[key] = (count, depth)
            continue
        if key in sizes:
            continue
        if key in active:
            raise ValueError(f"an alias refers to a node that contains it (line "
                             f"{node.start_mark.line + 1})")
        active.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


def load_yaml(text: str) -> Any:
    """The data of YAML ``text`` (``None`` for an empty document); a ``ValueError`` of
    one line saying what is wrong (syntax, size, depth, aliases, a repeated key)."""
    if len(text) > MAX_BYTES:
        raise ValueError(f"longer than {MAX_BYTES >> 10} kB")
    loader = _Bounded(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded(node)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        raise ValueError(f"not valid YAML ({' '.join(str(err).split())})") from None
    finally:
        loader.dispose()
