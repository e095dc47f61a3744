"""The names and formats loopfuse writes into IR and files and reads back: defined here only.

The tracer writes the attributes, the passes read and rewrite them, the runtime reads them back;
the pipeline names its IR stages and reproducers with the formats below, and loopfuse-opt reads
them again.
"""

# ---- attributes on @main's arguments and results --------------------------------------------
STATE = "loopfuse.state"            # arg/result, string: key path of a state leaf (pairs inputs with outputs)
PACKED = "loopfuse.packed"          # arg, array of strings: the key paths of the state leaves a packed buffer holds, in order
RESULT = "loopfuse.result"          # result, i32: the flat output index (state leaves, then aux leaves)
UNUSED = "loopfuse.unused"          # result, unit: the caller did not ask for this output
STEP_INDEX = "loopfuse.step_index"  # arg, unit: the scalar i32 global step counter
STOP = "loopfuse.stop"              # result, unit: a tensor<i1>, true = the loop stops after this step
STEPS_RUN = "loopfuse.steps_run"    # result, unit (wrap-loop puts it in place of STOP): tensor<i32> steps run
STOPPED = "loopfuse.stopped"        # result, unit (wrap-loop puts it after STEPS_RUN): tensor<i1>, the stop ended the loop;
                                    # arg, unit: tensor<i1>, the loop starts with it as that flag (true: no step runs)
ALIAS = "tf.aliasing_output"        # arg, i32 (read by XLA): result index this argument's buffer is reused for
DONOR = "jax.buffer_donor"          # arg, bool (read by XLA): the buffer may be reused by any output
SDY_SHARDING = "sdy.sharding"       # arg/result (written by jax, read by XLA): a leaf's Shardy sharding
SHARDINGS = (SDY_SHARDING, "mhlo.sharding")  # arg/result: a leaf's sharding, Shardy's or GSPMD's

# ---- attributes on ops ----------------------------------------------------------------------------
MICRO_BATCH = "loopfuse.micro_batch"  # stablehlo.while, i32: the loop micro-batch builds, over that many slices
SUNK = "loopfuse.sunk"                # unit, only while roll-layers runs: an op `sink_leaf_ops` cloned into a loop body

# ---- values of attributes -------------------------------------------------------------------------
TOKEN_PATH = "<effect token {}>"    # the STATE of the N-th ordered-effect token argument and result

# ---- functions ----------------------------------------------------------------------------------
BODY = "loopfuse_step"              # the private function wrap-loop moves the step into; its loop calls it
INIT = "loopfuse_init"              # the tracer's, public until fold-init makes it private: a loop's initial state
RUN = "loopfuse_run"                # the private function fold-init moves @main into; @main calls it on @loopfuse_init's result

# ---- attributes on the module -------------------------------------------------------------------
REPORT_PREFIX = "loopfuse.report."  # + pass name, string: what the pass did (written to the dump as <pass>.txt)

# ---- files --------------------------------------------------------------------------------------
PIPELINE_HEADER = "// loopfuse-pipeline: "  # first line of a reproducer, followed by the pipeline text
SPLIT_MARKER = "// -----"                   # separates modules in one file (--split-input-file)
TRACED_STAGE = "00-traced"                  # the IR as traced, before any pass
FINAL_STAGE = "final"                       # the IR handed to XLA


def after_pass_stage(n: int, pass_name: str) -> str:
    """The name of the IR stage after the n-th pass (1-based): ``NN-after-<pass>``."""
    return f"{n:02d}-after-{pass_name}"
