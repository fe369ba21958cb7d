"""YAML that people read and commit (workflows, Kubernetes manifests): no aliases, keys in the order
given, multi-line strings in block style so scripts read as scripts."""

from __future__ import annotations

import re
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


# What a YAML 1.2 reader (Kubernetes' sigs.k8s.io/yaml, GitHub Actions) takes for a number, bool or null in a plain
# scalar and PyYAML (YAML 1.1) writes plain: `1e3`, `0o17`, `0x1F`. Quoted, a string stays a string (an env value of
# `1e3` was a float to the API server, which refuses a number where EnvVar.value is a string). And kubectl's go-yaml v2
# reads y, Y, n and N as booleans, which PyYAML's YAML 1.1 does not: `value: n` was false to the API server.
_YAML12_NOT_STR = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|0o[0-7]+|0x[0-9a-fA-F]+"
                             r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)|true|True|TRUE|false|False|FALSE|null|Null|NULL|~"
                             r"|[yYnN]")


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else "'" if _YAML12_NOT_STR.fullmatch(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120, default_flow_style=False)


def dump_all(docs: list[Any]) -> str:
    """A stream of documents, each starting with `---`."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, explicit_start=True, width=120)
