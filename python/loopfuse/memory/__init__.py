"""A program's memory: the buffers live at its peak (`memory_report`, read from XLA's dump by `xla_dump`, drawn
by `memory_timeline`) and the plan whose peak fits a `memory_limit` (`memory_plan`)."""
