"""The repository as the checks read it, parsed once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from keel.design.wiring.ci import CiBuild, CiImage, ci_images
from keel.design.wiring.commands import TfCommand
from keel.design.wiring.model import Instance, TfModule
from keel.design.wiring.terraform import instances, parse_terraform


@dataclass
class Repo:
    """Everything the checks read, parsed once."""

    files: Mapping[str, str]
    modules: dict[str, TfModule]
    instances: list[Instance]
    pushed: list[CiImage]
    ci_terraform: list[TfCommand]
    ci_runs: set[str]
    built: list[CiBuild]

    @classmethod
    def parse(cls, files: Mapping[str, str]) -> Repo:
        modules = parse_terraform(files)
        pushed, commands, runs, built = ci_images(files)
        return cls(files, modules, instances(modules), pushed, commands, runs, built)

    def resource_types(self) -> set[str]:
        return {r.kind for m in self.modules.values() for r in m.resources}

    def instances_of(self, mod: TfModule) -> list[Instance]:
        return [i for i in self.instances if i.module is mod]
