"""The one way from a step function to an executable: options (`options`), the trace (`trace`, its record
`traced`), the pass pipeline (`pipeline`, `pass_manager`), XLA's options and compile (`xla`), the compile
cache (`cache`), the stages (`compiler`) and the executable with its calling convention (`executable`)."""
