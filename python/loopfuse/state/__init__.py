"""What loopfuse knows about the user's values: a pytree leaf (`leaves`: dtype, weak type, PRNG keys, its path),
a device-resident dataset (`data`), a state kept packed between calls (`packed`), leaves that are not arrays
held as the state's structure (`static_leaves`) and checkpoints of a run (`checkpoint`)."""
