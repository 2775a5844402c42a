"""The one shape of every list of named rules (gates, votes, settle, stop and branch rules,
refine strategies): a `Registry` of entries, each with a name and a one-line description.

A rule is added by adding its entry; what the rest of the project reads of the list follows
from the registry: Context's choices (`choice()`, hence the CLI's flags, the endpoint's
validation and Studio's form), the help texts (`describe()`), and one error for a name that
is none of them, worded alike everywhere (`check()`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Generic, Literal, Protocol, TypeVar

from pydantic import BeforeValidator


class Entry(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...


E = TypeVar("E", bound=Entry)


class Registry(Generic[E]):
    """Entries by name, in the order given; iterating gives the names, as a dict's keys.
    `registry[name]` is the entry, and an unknown name a ValueError that lists the names."""

    def __init__(self, noun: str, *entries: E) -> None:
        self.noun = noun  # what an entry is called in the error: "gate", "branch rule", ...
        self.entries = {entry.name: entry for entry in entries}
        self.names: tuple[str, ...] = tuple(self.entries)

    def check(self, name: object) -> str:
        """`name`, or a ValueError listing the names: `unknown gate 'x': choose one of ...`."""
        if name not in self:
            raise ValueError(f"unknown {self.noun} {name!r}: choose one of {', '.join(self)}")
        return str(name)

    def __getitem__(self, name: object) -> E:
        return self.entries[self.check(name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.entries

    def values(self) -> Iterator[E]:
        return iter(self.entries.values())

    def describe(self) -> str:
        """Each entry's name and description, for help texts: `never: ...; always: ...`."""
        return "; ".join(f"{entry.name}: {entry.description}" for entry in self.values())

    def choice(self) -> Any:
        """The type of a Context field that names an entry: the Literal of the names (the
        CLI's choices, Studio's form), checked first by `check` so that a bad name gets the
        registry's error rather than pydantic's."""
        return Annotated[Literal[self.names], BeforeValidator(self.check)]
