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

from catalog.catalog import Catalog


def catalog_digest(catalog: Catalog) -> str:
    """sha256 (hex) of the catalog's models as definitions, in order, with their origin."""
    data = [[m.to_definition(), catalog.is_declared(m.name)] for m in catalog.models()]
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
