"""What a resumed run may change: ``MAY_CHANGE_ON_RESUME`` names whole dotted keys or
whole sections, never bare prefixes (``train.steps`` allows ``train.steps``, not
``train.steps_per_eval``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from turnrl.train.run import config_changes


@dataclass
class Train:
    steps: int = 10
    steps_per_eval: int = 2
    seed: int = 0


@dataclass
class Config:
    train: Train = field(default_factory=Train)
    train_label: str = "a"
    label: str = "a"
    labels: tuple[str, ...] = ()


def test_an_allowed_key_does_not_allow_keys_it_is_a_prefix_of() -> None:
    old = Config()
    new = Config(
        train=replace(old.train, steps=20, steps_per_eval=3),
        train_label="b",
        label="b",
        labels=("x",),
    )
    changes = config_changes(old, new, ("train.steps", "label", "train"))
    assert changes == [
        "labels ([] -> ['x'])",
        "train_label ('a' -> 'b')",
    ]
    assert config_changes(old, new, ("train.steps", "label")) == [
        "labels ([] -> ['x'])",
        "train.steps_per_eval (2 -> 3)",
        "train_label ('a' -> 'b')",
    ]
    assert config_changes(old, new, ("train.steps_per_eval", "train_label", "labels")) == [
        "label ('a' -> 'b')",
        "train.steps (10 -> 20)",
    ]


def test_a_section_allows_every_key_under_it() -> None:
    old = Config()
    new = Config(train=Train(steps=1, steps_per_eval=1, seed=1))
    assert config_changes(old, new, ("train",)) == []
    assert config_changes(old, new, ("train.seed",)) == [
        "train.steps (10 -> 1)",
        "train.steps_per_eval (2 -> 1)",
    ]
