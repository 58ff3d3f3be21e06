"""Observing code that is never decorated: ``jc.watch()`` and ``python -m jaxcontracts audit``."""
