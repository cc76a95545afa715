"""A config's simulated providers (``kind = "simulator"``): started with a client, stopped with it.

Each simulated provider a route (or ``default_provider``) uses is a :class:`~llmroute.testing.
Simulator` on 127.0.0.1, over TLS with the process's one simulator CA, with the profile and
phases of its table. :func:`~llmroute.config.resolve` takes their addresses, so the config needs
no ``base_url``, key or ``verify`` for them (docs/simulator.md).
"""

from __future__ import annotations

import importlib.util
import zlib
from typing import TYPE_CHECKING, Any

from .config import SIMULATOR, Config, ConfigError, SimulatorAddress, used_providers

if TYPE_CHECKING:
    from .testing import Profile, Simulator

__all__ = ["SimulatedProviders"]


class SimulatedProviders:
    """The running simulators of one config, by provider name."""

    def __init__(self, config: Config | None) -> None:
        self.simulators: dict[str, Simulator] = {}
        if config is None:
            return
        names = [
            name
            for name in used_providers(config)
            if name in config.providers and config.providers[name].kind == SIMULATOR
        ]
        if not names:
            return
        for module in ("hypercorn", "trustme"):
            if importlib.util.find_spec(module) is None:
                from ._install import install_hint

                raise ConfigError(
                    f"{config.source}: providers.{names[0]}: a simulated provider needs the "
                    f"simulator, whose dependency {module} is not installed: "
                    f"{install_hint('testing')}"
                )
        from .testing import Simulator, profile_of

        try:
            for name in names:
                settings = config.providers[name]
                profile = profile_of(settings.profile)
                if not _sets_seed(settings.profile):
                    # Two providers of one preset must not stall on the same requests.
                    profile = _with_seed(profile, zlib.crc32(name.encode()))
                phases = [(phase.after, phase.profile) for phase in settings.phases]
                self.simulators[name] = Simulator(profile=profile, phases=phases).start()
        except BaseException:
            self.stop()
            raise

    @property
    def addresses(self) -> dict[str, SimulatorAddress]:
        """Where each simulator answers, for :func:`~llmroute.config.resolve`."""
        return {
            name: SimulatorAddress(sim.base_url, sim.ca_pem_path)
            for name, sim in self.simulators.items()
        }

    def stop(self) -> None:
        """Stop every simulator (each within a few seconds; a blocking call)."""
        simulators, self.simulators = self.simulators, {}
        for sim in simulators.values():
            sim.stop()

    def __bool__(self) -> bool:
        return bool(self.simulators)


def _sets_seed(table: str | dict[str, Any] | None) -> bool:
    return isinstance(table, dict) and "seed" in table


def _with_seed(profile: Profile, seed: int) -> Profile:
    import dataclasses

    return dataclasses.replace(profile, seed=seed)
