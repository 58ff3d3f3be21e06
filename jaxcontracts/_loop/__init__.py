"""Hot loops: the guard, the read interceptors, the loop stack, interrupts, JAX's errors
translated, ``jc.fetch``, ``jax.random`` in loops."""
