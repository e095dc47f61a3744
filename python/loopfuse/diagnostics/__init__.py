"""Checking and debugging programs: a compiled step against jax.jit, with the bisection to the pass at fault
(`verify`), and the `loopfuse-opt` command line (`opt`)."""
