"""The jaxcontracts demo: ``python -m jaxcontracts demo``.

A small N-particle simulation, end to end, written as a user would write it,
with the public API only:

* :mod:`.simulation`: the state, the physics, two hot steps and the loop;
* :mod:`.regressions`: three planted regressions, each shown caught;
* :mod:`.cli`: the command (:func:`main`) and its output (:func:`run_demo`).
"""

from .cli import main as main
from .cli import run_demo as run_demo
from .simulation import Particles as Particles
from .simulation import simulate as simulate

__all__ = ["Particles", "main", "run_demo", "simulate"]
