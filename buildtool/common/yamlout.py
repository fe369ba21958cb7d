"""YAML that people read and commit (workflows, Kubernetes manifests): no aliases, keys in the order
given, multi-line strings in block style so scripts read as scripts."""

from __future__ import annotations

from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120, default_flow_style=False)


def dump_all(docs: list[Any]) -> str:
    """A stream of documents, each starting with `---`."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, explicit_start=True, width=120)
