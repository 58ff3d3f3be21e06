"""What is checked while a step, a state class or a spec is defined or built
(raised there, never inside a loop)."""

from __future__ import annotations

from .._errors import Contract, DefinitionError, SpecError, declare

__all__: list[str] = []

declare(Contract("definition", "the decorator, options and annotations are valid", DefinitionError))
declare(Contract("state-fields", "every field matches its annotation", SpecError))
declare(Contract("dims", "every dimension and static value is given", SpecError))
