"""Every file of test data says where it came from and under what terms it is here.

The openb trace is a third party's data with no licence stated; a file added beside it
without an entry in ``tests/data/README.md`` would leave its terms unknown again.
"""

from __future__ import annotations

import re
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"
README = DATA / "README.md"


def _sections() -> dict[str, str]:
    """The README's text from each file's first mention (a list item) to the next item."""
    text = README.read_text()
    found: dict[str, str] = {}
    for path in DATA.iterdir():
        if path.name == README.name or path.name.startswith("."):
            continue
        match = re.search(rf"^- (?:`[^`]+`, )*`{re.escape(path.name)}`", text, re.MULTILINE)
        found[path.name] = "" if match is None else text[match.start() :]
    return found


def test_every_data_file_has_an_entry_with_its_licence() -> None:
    for name, section in _sections().items():
        assert section, f"tests/data/{name} has no entry in tests/data/README.md"
        assert re.search(r"Licence:", section), f"tests/data/{name}: its entry states no licence"


def test_the_openb_trace_names_its_source_and_that_no_licence_is_stated() -> None:
    text = README.read_text()
    assert "https://github.com/alibaba/clusterdata" in text
    assert "none is stated" in text
    assert "research or study purpose" in text
    for user in ("bench/placement/openb.py", "tests/unit/scheduler/"):
        assert user in text
