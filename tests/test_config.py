"""Typed TOML config: round trips, overrides, error messages, docstrings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from turnrl.train.config import (
    RunConfig,
    config_to_dict,
    config_to_toml_text,
    describe_config,
    field_docs,
    load_config,
)


@dataclass
class Inner:
    """A nested section."""

    n: int = 1
    """An integer."""
    xs: list[float] = field(default_factory=lambda: [0.5])
    """Some floats."""


@dataclass
class Outer:
    """A small config for the generic machinery."""

    name: str = "a"
    """A name."""
    maybe: int | None = None
    """An optional integer."""
    flag: bool = False
    """A flag."""
    rate: float = 0.1
    """A float."""
    inner: Inner = field(default_factory=Inner)
    """The nested section."""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_defaults_without_file() -> None:
    assert load_config(RunConfig) == RunConfig()


def test_toml_values_and_int_widening(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        'name = "b"\nmaybe = 3\nrate = 2\n\n[inner]\nn = 5\nxs = [1, 2.5]\n',
    )
    config = load_config(Outer, path)
    assert config == Outer(name="b", maybe=3, rate=2.0, inner=Inner(n=5, xs=[1.0, 2.5]))
    assert isinstance(config.rate, float)


def test_round_trip_run_config(tmp_path: Path) -> None:
    config = load_config(
        RunConfig,
        overrides=[
            "label=tool grpo",
            "env.env_kwargs={digits = 3, name = 'x y'}",
            "credit.estimator=a2tgpo",
            'credit.params={group_key = "turn", gamma = 0.9, weird-key = [1, 2]}',
            "train.lr=1e-5",
            "train.clip_high=0.28",
        ],
    )
    text = config_to_toml_text(config)
    path = _write(tmp_path, text)
    assert load_config(RunConfig, path) == config
    # docstrings travel as comments, so the copy in the run dir explains itself
    assert "# PPO clip width below 1" in text
    assert config_to_dict(config)["credit"]["params"]["gamma"] == 0.9


def test_none_is_written_as_comment_and_round_trips(tmp_path: Path) -> None:
    text = config_to_toml_text(Outer())
    assert "# maybe = (none)" in text
    assert load_config(Outer, _write(tmp_path, text)) == Outer()


def test_overrides_parse_by_field_type() -> None:
    config = load_config(
        Outer,
        overrides=[
            "name=123",  # str field: taken verbatim, not as an int
            "maybe=7",
            "flag=true",
            "rate=3",
            "inner.n=9",
            "inner.xs=[1, 2]",
        ],
    )
    assert config == Outer(name="123", maybe=7, flag=True, rate=3.0, inner=Inner(9, [1.0, 2.0]))
    assert load_config(Outer, overrides=["maybe=none"]).maybe is None
    assert load_config(Outer, overrides=['name="quoted"']).name == "quoted"


def test_override_into_dict_field() -> None:
    config = load_config(RunConfig, overrides=["credit.params.gamma=0.5", "credit.params.k=x"])
    assert config.credit.params == {"gamma": 0.5, "k": "x"}


def test_overrides_apply_after_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "[inner]\nn = 5\n")
    assert load_config(Outer, path, ["inner.n=6"]).inner.n == 6


def test_unknown_field_names_file_key_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "[train]\nlr = 0.1\nlearning_rate = 0.2\n")
    with pytest.raises(ValueError, match=r"run\.toml:3: train\.learning_rate: unknown field"):
        load_config(RunConfig, path)


def test_unknown_section_names_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "run_dir = 'x'\n\n[trian]\nlr = 0.1\n")
    with pytest.raises(ValueError, match=r"run\.toml:3: trian: unknown section"):
        load_config(RunConfig, path)


def test_wrong_type_names_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "[policy]\nmodel = 'tiny'\nlayers = 'two'\n")
    with pytest.raises(ValueError, match=r"run\.toml:3: policy\.layers: expected an integer"):
        load_config(RunConfig, path)
    path = _write(tmp_path, "[train]\nseed = true\n")
    with pytest.raises(ValueError, match="expected an integer, got True"):
        load_config(RunConfig, path)
    path = _write(tmp_path, "train = 3\n")
    with pytest.raises(ValueError, match=r"run\.toml:1: train: is a section"):
        load_config(RunConfig, path)


def test_invalid_toml_names_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "[train\n")
    with pytest.raises(ValueError, match=r"run\.toml: invalid TOML"):
        load_config(RunConfig, path)


def test_bad_overrides() -> None:
    with pytest.raises(ValueError, match=r"override 'train\.lrr=1': train\.lrr: unknown field"):
        load_config(RunConfig, overrides=["train.lrr=1"])
    with pytest.raises(ValueError, match=r"train\.steps: expected an integer, got 'many'"):
        load_config(RunConfig, overrides=["train.steps=many"])
    with pytest.raises(ValueError, match="expected true or false"):
        load_config(Outer, overrides=["flag=1"])
    with pytest.raises(ValueError, match="is a section"):
        load_config(RunConfig, overrides=["train=3"])
    with pytest.raises(ValueError, match="not a section"):
        load_config(RunConfig, overrides=["run_dir.x=3"])
    with pytest.raises(ValueError, match=r"expected section\.field=value"):
        load_config(RunConfig, overrides=["train.lr"])


def _all_config_classes(cls: type) -> list[type]:
    found = [cls]
    for f in dataclasses.fields(cls):
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(sub, type) and dataclasses.is_dataclass(sub):
            found.extend(_all_config_classes(sub))
    return found


def test_every_run_config_field_has_a_docstring() -> None:
    for cls in _all_config_classes(RunConfig):
        missing = [f.name for f in dataclasses.fields(cls) if not field_docs(cls).get(f.name)]
        assert missing == [], f"{cls.__name__} fields without docstring: {missing}"


def test_describe_config_lists_fields_with_docs() -> None:
    text = describe_config(Outer)
    assert "name: str = 'a'\n    A name." in text
    assert "[inner]  A nested section." in text
    assert "inner.xs: list[float] = [0.5]\n    Some floats." in text
    full = describe_config(RunConfig)
    assert "train.clip_high: float = 0.2" in full
    assert "warm_start.tool_fraction" in full
