"""Whether a configuration lies in a space, and the values a sampler would choose to give it:
`suggest` replayed against the configuration (a prior's or a baseline's first trial)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.search.space import Space, suggest


class _Replay:
    """A Suggester that answers with a given configuration's values, and notes those outside the
    domain it was asked for."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config, self.chosen, self.outside = config, {}, []

    def _answer(self, name: str, inside: bool) -> Any:
        if not inside:
            self.outside.append(name)
        self.chosen[name] = self.config.get(name)
        return self.chosen[name]

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float:
        value = self.config.get(name)
        return self._answer(
            name,
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and low <= value <= high,
        )

    def suggest_int(self, name: str, low: int, high: int, *, log: bool = False) -> int:
        value = self.config.get(name)
        return self._answer(
            name, isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
        )

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self._answer(
            name,
            any(
                self.config.get(name) == c and type(self.config.get(name)) is type(c)
                for c in choices
            ),
        )


def sampled_values(space: Space, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The values a sampler would choose for `suggest` to give `config` (a full configuration):
    None when `config` lies outside the space (a value outside its domain, or a fixed knob that
    differs)."""
    replay = _Replay(config)
    suggested = suggest(space, replay)
    if replay.outside or any(value != config.get(name) for name, value in suggested.items()):
        return None
    return replay.chosen
