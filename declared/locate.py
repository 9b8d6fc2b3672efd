"""Where in a declared catalog file a refusal points: the line of the field to edit. Pure.

A refusal names the model, profile and field (``catalog.CatalogError``); an
operator editing a file of hundreds of models also wants the line. The file is
composed into YAML nodes (which keep their marks) only after it was read within
bounds (``catalog.reading.documents``): this runs on a refused file that parsed.
"""

from __future__ import annotations

import re

import yaml

_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INDEX = re.compile(r"models\[(\d+)\]")
# What a YAML error's message says of where it is ("line 4, column 7").
_YAML_LINE = re.compile(r"\bline (\d+)\b")


def line_of(
    text: str,
    message: str,
    *,
    model: str | None = None,
    profile: str | None = None,
    field: str | None = None,
) -> int | None:
    """The 1-based line of the most precise place the refusal names, or None."""
    found = _YAML_LINE.search(message)
    if found and not _INDEX.search(message):
        return int(found.group(1))
    try:
        root = yaml.compose(text, Loader=_SafeLoader)
    except yaml.YAMLError:
        return None
    models = _get(root, "models")
    if not isinstance(models, yaml.SequenceNode):
        return None
    node = _model_node(models, message, model)
    if node is None:
        return None
    best: yaml.Node = node
    if profile is not None:
        profiles = _get(node, "profiles")
        if isinstance(profiles, yaml.SequenceNode):
            for item in profiles.value:
                if _scalar(_get(item, "name")) == profile:
                    best = item
                    break
    if field:
        best = _field(best, field) or best
    return int(best.start_mark.line) + 1


def _model_node(models: yaml.SequenceNode, message: str, name: str | None) -> yaml.Node | None:
    index = _INDEX.search(message)
    if index is not None and int(index.group(1)) < len(models.value):
        found: yaml.Node = models.value[int(index.group(1))]
        return found
    for item in models.value:
        if name is not None and _scalar(_get(item, "name")) == name:
            return item  # type: ignore[no-any-return]
    return None


def _field(node: yaml.Node, field: str) -> yaml.Node | None:
    """The key node of ``field`` (dotted for nested mappings: ``scaling.max``)."""
    key: yaml.Node | None = None
    for dotted in field.split("."):
        part = re.sub(r"\[\d+\]$", "", dotted)
        if not isinstance(node, yaml.MappingNode):
            return key
        for k, v in node.value:
            if _scalar(k) == part:
                key, node = k, v
                break
        else:
            return key
    return key


def _get(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    for k, v in node.value:
        if _scalar(k) == key:
            return v  # type: ignore[no-any-return]
    return None


def _scalar(node: yaml.Node | None) -> str | None:
    return node.value if isinstance(node, yaml.ScalarNode) else None
