"""What users call: `compile_step` and `Step` (`step`), the chunked drivers `fit` (`fitting`) and `minimize`
(`solve`, its backends in `backends`) over `chunks`, ensembles (`ensemble`, their tiles in `tiles`), stop
predicates (`convergence`), `largest_batch` (`batch_fit`) and what the drivers return (`results`)."""
