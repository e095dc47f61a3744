"""ir_helpers.interpret: an op the StableHLO reference interpreter aborts on (jnp.square's chlo.square)
is an InterpreterAbort naming it, and the test run goes on (the interpreter runs in a child process)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ir_helpers import InterpreterAbort, interpret
from loopfuse.compile.mlir_context import parse_module
from loopfuse.compile.trace import trace

SQUARE = """
func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
  %0 = chlo.square %x : tensor<3xf32> -> tensor<3xf32>
  return %0 : tensor<3xf32>
}"""
MULTIPLY = SQUARE.replace("chlo.square %x : tensor<3xf32> -> tensor<3xf32>", "stablehlo.multiply %x, %x : tensor<3xf32>")


def test_an_op_the_interpreter_aborts_on_is_an_exception_and_the_next_module_runs():
    x = np.arange(3, dtype=np.float32)
    with pytest.raises(InterpreterAbort, match=r"aborted .*LLVM ERROR: Unsupported op: .*chlo\.square"):
        interpret(parse_module(SQUARE), [x])
    np.testing.assert_array_equal(interpret(parse_module(MULTIPLY), [x])[0], x * x)


def test_a_step_with_jnp_square_is_interpreted_or_refused_never_fatal():
    """With jax 0.10 jnp.square lowers to chlo.square, which the interpreter cannot evaluate."""
    def step(w, b):
        return w - 0.1 * jnp.square(w - b), {"loss": jnp.sum(w)}
    w, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    module = trace(step, w, b, {}, None).module
    try:
        got = interpret(module, [w, b])
    except InterpreterAbort as e:
        assert "chlo.square" in str(module) and "chlo.square" in str(e)
    else:
        np.testing.assert_array_equal(got[0], np.asarray(jax.jit(step)(w, b)[0]))
