"""A short, stable fingerprint of a catalog's definitions.

Replay's outcome depends on the declared models (configuration wins every
conflict), so whatever is derived from a replay, a snapshot of its state or a
runtime change validated against it, records which declared catalog it was
built with. The digest covers the normalised definitions in order, not the
file's bytes: a comment or a reordered key in catalog.yaml changes nothing.
"""

from __future__ import annotations

import hashlib
import json

from catalog.definition.model import Model
from catalog.whole.catalog import Catalog


def model_version(model: Model) -> str:
    """A model's version: sha256 (hex, first 32) of its normalised definition.

    A placement records the version it was placed with (``scheduler``), and its
    agent is sent that version's definition until the replica is replaced, so a
    change to the catalog never changes what a running replica runs in place.
    """
    # Every round asks for every model's version, and a catalog's models are the same
    # (immutable) objects from round to round: remembered by identity, holding the
    # model so that its id cannot be reused while remembered.
    hit = _VERSIONS.get(id(model))
    if hit is not None and hit[0] is model:
        return hit[1]
    text = json.dumps(model.to_definition(), sort_keys=True, separators=(",", ":"))
    version = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    if len(_VERSIONS) >= _REMEMBERED:
        _VERSIONS.clear()
    _VERSIONS[id(model)] = (model, version)
    return version


# id(model) -> (model, version); cleared whole past _REMEMBERED entries.
_VERSIONS: dict[int, tuple[Model, str]] = {}
_REMEMBERED = 100_000


def catalog_digest(catalog: Catalog) -> str:
    """sha256 (hex) of the catalog's models as definitions, in order, with their origin."""
    data = [[m.to_definition(), catalog.is_declared(m.name)] for m in catalog.models()]
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
