"""A model's recipe: its class and constructor arguments, so that a workdir can say how to build it again."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import ml_collections
from flax import nnx


@dataclasses.dataclass
class ModelBuilder:
    """`rngs → cls(cfg, **kwargs, rngs=rngs)`; a keyword given as a callable is called when the model is built (a
    vocabulary size read from the prepared data). `spec()`, what was built, is the workdir's model.json."""

    cls: type
    cfg: ml_collections.ConfigDict
    kwargs: dict[str, Any | Callable[[], Any]]
    built_with: dict[str, Any] | None = None

    def __call__(self, rngs: nnx.Rngs) -> nnx.Module:
        kwargs = {name: value() if callable(value) else value for name, value in self.kwargs.items()}
        self.built_with = kwargs
        return self.cls(self.cfg, **kwargs, rngs=rngs)

    def spec(self) -> dict[str, Any]:
        """{"class": "zoo.models.Name", "kwargs": {...}} of the last model built."""
        if self.built_with is None:
            raise ValueError("ModelBuilder.spec(): no model built yet")
        return {"class": f"{self.cls.__module__}.{self.cls.__qualname__}", "kwargs": self.built_with}


def model_class(name: str) -> type:
    """The model class a spec names: one of `zoo.models`' classes (nothing else is imported from a workdir)."""
    module, _, cls = name.rpartition(".")
    found = getattr(importlib.import_module(module), cls, None) if module.startswith("zoo.models") else None
    if not isinstance(found, type) or not issubclass(found, nnx.Module):
        raise ValueError(f"model class {name!r} is not one of zoo.models' classes")
    return found
