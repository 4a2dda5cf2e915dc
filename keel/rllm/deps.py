"""Composition: load the apps an app ``uses``, check their contracts, build the graph.

A parent names each child by a path relative to the parent's own file, the fields of
the child's output it reads (``exposes``) and how its variables feed the child's inputs
(``input_map``); ``output_map`` copies exposed fields into the parent's output. All of
it is checked here, before anything runs:

* every child loads (a child's own error is wrapped with the chain that led to it);
* there is no cycle (the error names it: ``a.rllm -> b.rllm -> a.rllm``);
* exposed fields exist in the child's ``output_schema``;
* every required child input without a default is mapped, every mapped name is a child
  input, and each mapped value's schema fits the child input's schema;
* each ``output_map`` field's child schema fits the parent's output property.

"Fits" is :func:`keel.rllm.schema.compatibility_problems`: types, enums, object shape
and array items; ranges and lengths are checked again when the child validates its input.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from keel.digest import digest_json
from keel.rllm.errors import DependencyResolutionError, RllmError
from keel.rllm.model import LLMSpec, RllmProgram, UseSpec
from keel.rllm.schema import compatibility_problems, resolve_local

Loader = Callable[[Path], RllmProgram]


class DependencyNode(BaseModel):
    """One app in the graph, keyed by its path relative to the root app's directory."""

    key: str
    name: str
    version: str
    source_digest: str
    needs_llm: bool
    llm: LLMSpec
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]


class DependencyEdge(BaseModel):
    """A ``uses`` entry: ``parent`` runs ``child`` under ``alias``.

    ``after`` lists the aliases of the same parent whose outputs this child's
    ``input_map`` reads; children with no ``after`` between them may run in parallel.
    """

    parent: str
    child: str
    alias: str
    exposes: list[str]
    input_map: dict[str, str] = Field(default_factory=dict)
    after: list[str] = Field(default_factory=list)


class DependencyGraph(BaseModel):
    """The apps reachable from ``root`` through ``uses`` (for ``runllm inspect``)."""

    root: str
    nodes: dict[str, DependencyNode]
    edges: list[DependencyEdge]

    def children(self, key: str) -> list[DependencyEdge]:
        """The ``uses`` edges of one app, in file order."""
        return [e for e in self.edges if e.parent == key]

    def order(self) -> list[str]:
        """Every app once, each after all the apps it uses (children first, root last)."""
        seen: list[str] = []

        def visit(key: str) -> None:
            if key in seen:  # a child shared by several parents is listed once
                return
            for e in self.children(key):
                visit(e.child)
            seen.append(key)

        visit(self.root)
        return seen

    def digest(self) -> str:
        """BLAKE3 over every app's path and source digest: changes when any file does."""
        return digest_json({k: n.source_digest for k, n in sorted(self.nodes.items())})


class ResolvedApp(BaseModel):
    """A root app with every app it reaches, loaded and checked."""

    graph: DependencyGraph
    programs: dict[str, RllmProgram]

    @property
    def root(self) -> RllmProgram:
        """The app that was resolved."""
        return self.programs[self.graph.root]

    def child(self, edge: DependencyEdge) -> RllmProgram:
        """The program an edge runs."""
        return self.programs[edge.child]


def _display(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path, base)).as_posix()


class _Resolver:
    def __init__(self, base: Path, shown_base: Path, loader: Loader) -> None:
        self.base = base
        # Children are loaded by paths built like the root's was given (relative stays
        # relative), so error messages and source_path read as the user wrote them.
        self.shown_base = shown_base
        self.loader = loader
        self.programs: dict[str, RllmProgram] = {}
        self.edges: list[DependencyEdge] = []
        self.done: set[str] = set()

    def key(self, path: Path) -> str:
        return _display(path, self.base)

    def visit(self, program: RllmProgram, path: Path, stack: list[Path]) -> None:
        key = self.key(path)
        self.programs[key] = program
        if key in self.done:
            return
        by_alias: dict[str, RllmProgram] = {}
        for i, use in enumerate(program.uses):
            child_path = Path(os.path.normpath(path.parent / use.path))
            child_key = self.key(child_path)
            where = f"{key}: uses[{i}] ({use.alias})"
            base = {"file": key, "use": i, "alias": use.alias, "child": child_key}
            chain = [*stack, path]
            if child_path in chain:
                cycle = [self.key(p) for p in chain[chain.index(child_path) :]] + [child_key]
                raise DependencyResolutionError(
                    f"{where}: uses cycle: {' -> '.join(cycle)}",
                    details={**base, "cycle": cycle},
                    recovery_hint="Remove one uses entry of the cycle; apps compose like "
                    "functions and may not call themselves, directly or through others.",
                )
            if child_key in self.programs:
                child = self.programs[child_key]
            else:
                try:
                    child = self.loader(Path(os.path.normpath(self.shown_base / child_key)))
                except DependencyResolutionError:
                    raise
                except RllmError as e:
                    raise DependencyResolutionError(
                        f"{where}: {child_key} cannot be used: {e.message}",
                        details={**base, "cause": e.to_payload().model_dump(mode="json")},
                        recovery_hint="Fix the child file (details.cause says how) or the "
                        "path, which is relative to the parent file.",
                    ) from None
            _check_edge(program, use, child, by_alias, where, base)
            self.edges.append(
                DependencyEdge(
                    parent=key,
                    child=child_key,
                    alias=use.alias,
                    exposes=list(use.exposes),
                    input_map=dict(use.input_map),
                    after=sorted(
                        {ref.split(".")[0] for ref in use.input_map.values()} & set(by_alias)
                    ),
                )
            )
            by_alias[use.alias] = child
            self.visit(child, child_path, chain)
        _check_output_map(program, by_alias, key)
        self.done.add(key)


def _ref_schema(
    parent: RllmProgram, ref: str, by_alias: Mapping[str, RllmProgram]
) -> tuple[dict[str, Any] | None, bool]:
    """The schema of a parent reference and whether it may be absent (``None``: unknown)."""
    parts = ref.split(".")
    if parts[0] in by_alias:
        out = by_alias[parts[0]].output_schema
        field = parts[1] if len(parts) > 1 else None
        if field is None:
            return None, False
        schema = out.get("properties", {}).get(field)
        optional = field not in out.get("required", [])
        return _walk(out, schema, parts[2:], optional)
    props = parent.input_schema.get("properties", {})
    if parts[0] not in props:
        return None, False  # a pre-block output: untyped until it runs
    schema = props[parts[0]]
    optional = parts[0] not in parent.input_schema.get("required", []) and "default" not in schema
    return _walk(parent.input_schema, schema, parts[1:], optional)


def _walk(
    root: Mapping[str, Any], schema: Any, rest: list[str], optional: bool
) -> tuple[dict[str, Any] | None, bool]:
    for part in rest:
        schema = resolve_local(root, schema)
        if not isinstance(schema, dict):
            return None, optional
        props = schema.get("properties", {})
        if part in props:
            if part not in schema.get("required", []) and "default" not in props[part]:
                optional = True
            schema = props[part]
        elif part.isdigit() and isinstance(schema.get("items"), dict):
            schema, optional = schema["items"], True  # an index may be out of range
        else:
            return None, optional
    return (schema if isinstance(schema, dict) else None), optional


def _check_edge(
    parent: RllmProgram,
    use: UseSpec,
    child: RllmProgram,
    by_alias: Mapping[str, RllmProgram],
    where: str,
    base: dict[str, Any],
) -> None:
    out_props = child.output_schema.get("properties", {})
    missing = [f for f in use.exposes if f not in out_props]
    if missing:
        raise DependencyResolutionError(
            f"{where}: exposes {', '.join(missing)}, but {child.name!r} outputs only "
            f"{', '.join(out_props)}",
            details={**base, "unknown_fields": missing},
            expected_schema=child.output_schema,
        )
    in_props = child.input_schema.get("properties", {})
    unknown = sorted(set(use.input_map) - set(in_props))
    if unknown:
        raise DependencyResolutionError(
            f"{where}: input_map sets {', '.join(unknown)}, which {child.name!r} does not "
            f"take (its inputs: {', '.join(in_props)})",
            details={**base, "unknown_inputs": unknown},
            expected_schema=child.input_schema,
        )
    unmapped = [
        r
        for r in child.input_schema.get("required", [])
        if r not in use.input_map and "default" not in in_props.get(r, {})
    ]
    if unmapped:
        raise DependencyResolutionError(
            f"{where}: input_map does not set {', '.join(unmapped)}, which {child.name!r} requires",
            details={**base, "unmapped_inputs": unmapped},
            expected_schema=child.input_schema,
        )
    required = set(child.input_schema.get("required", []))
    for name, ref in sorted(use.input_map.items()):
        source, optional = _ref_schema(parent, ref, by_alias)
        target = in_props[name]
        if source is None:
            continue
        problems = compatibility_problems(source, target, path=name)
        if optional and name in required and "default" not in target:
            problems.append(f"{name}: {ref!r} may be absent but {child.name!r} requires it")
        if problems:
            raise DependencyResolutionError(
                f"{where}: input_map {name} <- {ref}: {problems[0]}",
                details={**base, "input": name, "ref": ref, "problems": problems},
                expected_schema=target,
                received_payload=source,
                recovery_hint="Map a parent variable whose schema fits the child input "
                "(expected_schema), or change one of the two schemas.",
            )


def _check_output_map(parent: RllmProgram, by_alias: Mapping[str, RllmProgram], key: str) -> None:
    props = parent.output_schema.get("properties", {})
    required = set(parent.output_schema.get("required", []))
    for name, ref in sorted(parent.output_map.items()):
        alias, field = ref.split(".")
        child = by_alias[alias]
        child_out = child.output_schema
        source = child_out.get("properties", {})[field]
        problems = compatibility_problems(source, props[name], path=name)
        if name in required and field not in child_out.get("required", []):
            problems.append(f"{name}: {ref!r} is optional in {child.name!r} but required here")
        if problems:
            raise DependencyResolutionError(
                f"{key}: output_map {name} <- {ref}: {problems[0]}",
                details={"file": key, "output": name, "ref": ref, "problems": problems},
                expected_schema=props[name],
                received_payload=source,
                recovery_hint="Make the parent's output property accept what the child "
                "outputs (expected_schema is the parent's, received_payload the child's).",
            )


def resolve(
    program: RllmProgram,
    *,
    path: str | os.PathLike[str] | None = None,
    loader: Loader,
    anchor: str = "/",
) -> ResolvedApp:
    """Load and check everything ``program`` uses, transitively.

    ``loader`` reads a used app: ``store.files.load_rllm`` from the disk, or a loader over
    the files sent with a run (``activities.rllm.bundle_loader``).

    ``path`` is the program's file (default: ``program.source_path``); ``uses`` paths are
    relative to it. Graph keys are paths relative to its directory, with ``/``.

    Raises:
        DependencyResolutionError: a child cannot be loaded, a cycle, or a contract that
            does not fit; ``details`` names the file, the ``uses`` index and alias.
    """
    where = path if path is not None else program.source_path
    if where is None:
        if program.uses:
            raise DependencyResolutionError(
                f"{program.name}: uses paths are relative to the app's file, and this app "
                "was parsed from text without a path",
                details={"app": program.name},
                recovery_hint="Load the app from its file, or pass path= to resolve().",
            )
        where = f"{program.name}.rllm"
    # Keys are relative to the root's directory; ``anchor`` makes a relative root absolute
    # (the runtime passes the process's working directory) without keel reading it.
    root_path = Path(os.path.normpath(os.path.join(anchor, where)))
    r = _Resolver(root_path.parent, Path(where).parent, loader)
    r.visit(program, root_path, [])
    nodes = {
        k: DependencyNode(
            key=k,
            name=p.name,
            version=p.version,
            source_digest=p.source_digest,
            needs_llm=p.needs_llm,
            llm=p.llm,
            input_schema=p.input_schema,
            output_schema=p.output_schema,
        )
        for k, p in sorted(r.programs.items())
    }
    graph = DependencyGraph(root=r.key(root_path), nodes=nodes, edges=r.edges)
    return ResolvedApp(graph=graph, programs=dict(sorted(r.programs.items())))
