"""The jaxcontracts benchmark suite: ``python -m benchmarks`` (see README.md here)."""
