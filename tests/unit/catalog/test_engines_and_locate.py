"""Engine names are the agents' (with a did-you-mean), and a refusal of the declared file
points at the line to edit."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.engines import ENGINES
from catalog import CatalogError, Model, load_declared, parse_model
from catalog.definition.engine_names import KNOWN_ENGINES
from catalog.definition.engines import check_engines, did_you_mean
from declared.locate import line_of
from tests.support import dump_yaml


def with_engine(engine: str) -> Model:
    return parse_model(
        {
            "name": "chat",
            "source": "org/chat",
            "profiles": [{"name": "p", "gpu_class": "A100", "engine": engine}],
        }
    )


def test_the_catalog_knows_exactly_the_engines_the_agent_runs() -> None:
    assert tuple(ENGINES) == KNOWN_ENGINES


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("vlm", "vllm"),
        ("VLLM", "vllm"),
        ("llama.cpp", "llamacpp"),
        ("llamacp", "llamacpp"),
        ("sm", "sim"),
    ],
)
def test_a_typo_is_refused_naming_the_engine_it_is_closest_to(typo: str, meant: str) -> None:
    with pytest.raises(CatalogError) as caught:
        check_engines(with_engine(typo))
    err = caught.value
    assert (err.model, err.profile, err.field) == ("chat", "p", "engine")
    assert f"did you mean {meant!r}?" in str(err)
    assert "set engine to one of vllm, llamacpp, sim" in str(err)


@given(st.sampled_from(KNOWN_ENGINES))
def test_every_known_engine_passes(engine: str) -> None:
    check_engines(with_engine(engine))


@given(st.from_regex(r"[a-z]([a-z0-9._-]{0,18}[a-z0-9])?", fullmatch=True))
def test_any_other_name_is_refused_and_a_guess_is_always_a_known_engine(engine: str) -> None:
    if engine in KNOWN_ENGINES:
        return
    with pytest.raises(CatalogError, match="is not one the agents run"):
        check_engines(with_engine(engine))
    guess = did_you_mean(engine)
    assert guess is None or guess in KNOWN_ENGINES


@given(st.sampled_from(KNOWN_ENGINES), st.data())
def test_one_letter_dropped_from_a_known_engine_is_guessed_back(
    engine: str, data: st.DataObject
) -> None:
    i = data.draw(st.integers(0, len(engine) - 1))
    typo = engine[:i] + engine[i + 1 :]
    if typo and typo not in KNOWN_ENGINES:
        assert did_you_mean(typo) == engine


FIELDS = ["gpus_per_node", "engine"]


@given(st.integers(0, 5), st.integers(0, 3), st.sampled_from(FIELDS))
def test_a_refusal_points_at_the_line_of_the_field_in_the_model_and_profile_it_names(
    bad_model: int, bad_profile: int, field: str
) -> None:
    models = []
    for m in range(6):
        profiles = []
        for p in range(4):
            profile: dict[str, object] = {"name": f"p{p}", "gpu_class": "A100", "tp": 1}
            if (m, p) == (bad_model, bad_profile):
                profile[field] = {"gpus_per_node": 2, "engine": "vlm"}[field]
                if field == "gpus_per_node":
                    profile["tp"] = 3
            profiles.append(profile)
        models.append({"name": f"m{m}", "source": "org/x", "profiles": profiles})
    text = dump_yaml({"models": models})
    path = Path("/nonexistent/catalog.yaml")
    try:
        from catalog.definition.engines import check_engines as check
        from catalog.reading.declared import parse_definitions
        from catalog.reading.documents import read_data

        for i, model in enumerate(
            parse_definitions(read_data(text, str(path)), str(path), allow_single=False)
        ):
            check(model, f"{path} models[{i}]")
    except CatalogError as exc:
        line = line_of(text, exc.message, model=exc.model, profile=exc.profile, field=exc.field)
        assert line is not None
        shown = text.splitlines()[line - 1]
        assert exc.field is not None and exc.field in shown, (shown, str(exc))
        # The line is inside the right model and profile.
        before = text.splitlines()[:line]
        assert [x for x in before if "name: m" in x][-1].endswith(f"name: m{bad_model}")
    else:
        pytest.fail("the bad profile was accepted")


def test_a_yaml_syntax_error_gives_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("models:\n  - name: a\n    source: [unclosed\n")
    with pytest.raises(CatalogError) as caught:
        load_declared(path)
    line = line_of(path.read_text(), caught.value.message)
    assert line is not None and 3 <= line <= 4
