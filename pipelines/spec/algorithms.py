"""The spec's ``algorithm`` section, derived from the registries.

Each registered policy loss gets a section model built from its options dataclass
(:mod:`asyncrlhf.losses.options`): the same fields, defaults, bounds and descriptions,
plus ``name`` and the advantage estimator. Which model validates a section is chosen by
its ``name`` when the spec is validated, so a loss registered by the user's own module
(imported before the spec is loaded) is a valid ``algorithm.name`` with nothing to add
here. Adding an objective is one file: the loss and its options.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Annotated, Any, Literal, Union, get_type_hints

from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

from pipelines.spec.files import _Section
from pipelines.spec.trust import names_unchecked, note_unchecked

__all__ = ["AlgorithmSection", "algorithm_model", "algorithm_names", "schema_union", "validate_algorithm"]


def algorithm_names() -> tuple[str, ...]:
    """The registered policy losses (what ``algorithm.name`` may be)."""
    from asyncrlhf.losses import policy_losses

    return policy_losses()


class AlgorithmSection(_Section):
    """What every algorithm section has: the loss's name and the advantage estimator."""

    name: str = Field(description="Policy loss (a registered name).")
    advantage: str = Field(
        "grpo",
        description="Advantage estimator (a registered name): 'grpo' (group mean and std), 'dr_grpo' (group mean "
        "only), 'rloo' (leave-one-out mean), 'reinforce_pp' (group mean, batch std).",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "scale_advantages" in data:
            value = data["scale_advantages"]
            raise ValueError(
                f"scale_advantages ({value!r}) became algorithm.advantage: 'grpo' for true, 'dr_grpo' for false"
            )
        return data

    @field_validator("advantage")
    @classmethod
    def _registered(cls, value: str) -> str:
        from asyncrlhf.advantages import get_advantage

        try:
            get_advantage(value)  # a ValueError listing the registered ones
        except ValueError:
            if _checking_names():
                raise
            note_unchecked(f"algorithm.advantage {value!r} (not registered: a plugin may register it)")
        return value

    def options(self) -> Any:
        """The loss's options dataclass, filled from this section."""
        from asyncrlhf.losses.registry import loss_options_of

        return loss_options_of(self.name)(**self.model_dump(exclude={"name", "advantage"}))

    def loss_options(self) -> dict[str, Any]:
        """Keyword options of the loss (its signature checks them when bound)."""
        return self.options().loss_options()

    @property
    def uses_reference(self) -> bool:
        """Whether the trainer needs a frozen reference policy (a KL term)."""
        return bool(self.options().uses_reference)


@functools.cache
def _model_for(name: str, options: type) -> type[AlgorithmSection]:
    hints = get_type_hints(options)
    fields: dict[str, Any] = {"name": (Literal[name], Field(name, description="Policy loss."))}
    for item in dataclasses.fields(options):
        meta = dict(item.metadata)
        fields[item.name] = (hints[item.name], Field(item.default, **meta))
    title = "".join(part.capitalize() for part in name.split("_")) + "Spec"
    return create_model(title, __base__=AlgorithmSection, __doc__=options.__doc__, **fields)


def algorithm_model(name: str) -> type[AlgorithmSection]:
    """The section model of the registered loss ``name`` (a ValueError names the registered ones)."""
    from asyncrlhf.losses.registry import loss_options_of

    return _model_for(name, loss_options_of(name))


def schema_union() -> Any:
    """The sections of the losses registered now, as one tagged union: what the JSON
    schema shows (validation also accepts losses registered later)."""
    models = tuple(algorithm_model(name) for name in algorithm_names())
    return Annotated[Union[models], Field(discriminator="name")]  # noqa: UP007


def validate_algorithm(value: Any) -> AlgorithmSection:
    """An ``algorithm`` mapping validated by its loss's model (no name: GRPO's)."""
    if isinstance(value, AlgorithmSection):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"algorithm must be a mapping with a name, got {type(value).__name__}")
    name = value.get("name", "grpo")
    if isinstance(name, str) and name not in algorithm_names() and not _checking_names():
        note_unchecked(f"algorithm.name {name!r} and its options (not registered: a plugin may register it)")
        return _UncheckedAlgorithm.model_validate({"name": name, **value})
    if not isinstance(name, str) or name not in algorithm_names():
        raise ValueError(f"name {name!r} is not a registered policy loss: {', '.join(algorithm_names())}")
    return algorithm_model(name).model_validate({"name": name, **value})


class _UncheckedAlgorithm(AlgorithmSection):
    """A section of a loss a plugin that was not imported may register (``validate``)."""

    model_config = ConfigDict(extra="allow")


def _checking_names() -> bool:
    """Names must be registered unless a spec is validated without its plugins."""
    return not names_unchecked()
