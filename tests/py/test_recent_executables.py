"""The executables this process compiled, kept in memory (`cache.RECENT`): a step built again for the same program
runs no pass and no XLA compile and computes the same bits; what must not be kept is not."""
import jax
import jax.numpy as jnp
import optax
import pytest

import loopfuse
from loopfuse.compile import cache, xla
from problems import assert_trees_equal, batch, fresh, init_state, mlp_loss, mlp_params, train_step

OPT = optax.adam(1e-2)
STEP = train_step(OPT)


@pytest.fixture
def compiles(monkeypatch):
    """The XLA compiles of loopfuse programs, counted, with nothing kept from earlier tests."""
    cache.RECENT.clear()
    count = [0]
    compile_module = xla.compile_module

    def counted(*args, **kwargs):
        count[0] += 1
        return compile_module(*args, **kwargs)
    monkeypatch.setattr(xla, "compile_module", counted)
    return count


def test_a_step_built_again_loads_its_executable_and_computes_the_same_bits(compiles, tmp_path):
    first = loopfuse.compile_step(STEP, keep_aux=("loss",))
    out_first = first(fresh(init_state(OPT)), batch())
    again = loopfuse.compile_step(STEP, keep_aux=("loss",), dump_ir=tmp_path)
    executable = again.compiled(init_state(OPT), batch())
    assert compiles[0] == 1 and set(executable.seconds) == {"trace", "drop-unused-outputs", "alias-state"}
    assert_trees_equal(again(fresh(init_state(OPT)), batch()), out_first)
    (folder,) = tmp_path.iterdir()     # (a dump runs the passes, for its stages)
    assert (folder / "executable.txt").read_text().startswith("compiled earlier in this process")
    loopfuse.compile_step(STEP, keep_aux=("loss",), donate=False).compiled(init_state(OPT), batch())
    assert compiles[0] == 2            # another program: its own compile


def test_a_new_loss_function_of_the_same_code_compiles_once(compiles):
    solutions = []
    for _ in range(2):                 # a new closure, written at the same place, each time
        solutions.append(loopfuse.minimize(lambda p, b: mlp_loss(p, b), mlp_params(), batch(), OPT, steps=5,
                                           backend=loopfuse.CompiledStep()))
    assert compiles[0] == 1
    assert_trees_equal(solutions[0].params, solutions[1].params)


def test_a_step_written_at_other_lines_is_the_same_program_and_another_op_is_not(compiles):
    """The key reads the traced module without its locations (`mlir_context.fingerprint`)."""
    def step_here(x, b):
        return x * b, {}

    def step_there(x, b):
        return x * b, {}

    def other(x, b):
        return x + b, {}
    for fn in (step_here, step_there):
        loopfuse.compile_step(fn).compiled(jnp.ones(3), jnp.ones(3))
    assert compiles[0] == 1
    loopfuse.compile_step(other).compiled(jnp.ones(3), jnp.ones(3))
    assert compiles[0] == 2


def test_an_executable_read_from_the_disk_cache_is_kept_in_memory_too(compiles, tmp_path, monkeypatch):
    loopfuse.compile_step(STEP, cache_dir=tmp_path).compiled(init_state(OPT), batch())     # compiled, stored
    cache.RECENT.clear()                                                                  # as a new process
    reads = [0]
    load = cache.Entry.load

    def counted(self, context):
        reads[0] += 1
        return load(self, context)
    monkeypatch.setattr(cache.Entry, "load", counted)
    for _ in range(2):
        loopfuse.compile_step(STEP, cache_dir=tmp_path).compiled(init_state(OPT), batch())
    assert (compiles[0], reads[0]) == (1, 1)


def test_what_must_not_be_kept_is_compiled_again(compiles, monkeypatch):
    def with_callback(state, b):
        jax.debug.callback(lambda: None)        # a host callback lives in the trace that made it
        return STEP(state, b)
    for _ in range(2):
        loopfuse.compile_step(with_callback).compiled(init_state(OPT), batch())
    assert compiles[0] == 2
    monkeypatch.setattr(cache.RECENT, "max_bytes", 100)       # as a module that embeds large constants
    for _ in range(2):
        loopfuse.compile_step(STEP).compiled(init_state(OPT), batch())
    assert compiles[0] == 4
    monkeypatch.setattr(cache.RECENT, "max_bytes", 2 << 20)
    monkeypatch.setattr(cache.RECENT, "size", 1)               # the last one only
    for keep in [("loss",), None, ("loss",)]:
        loopfuse.compile_step(STEP, keep_aux=keep).compiled(init_state(OPT), batch())
    assert compiles[0] == 7
    assert jnp.isfinite(loopfuse.compile_step(STEP)(fresh(init_state(OPT)), batch())[1]["loss"])


_DIFFRAX_CHILD = r"""
import diffrax, jax.numpy as jnp, optax, loopfuse
from loopfuse.compile import xla
count = [0]
compile_module = xla.compile_module
def counted(*args, **kwargs):
    count[0] += 1
    return compile_module(*args, **kwargs)
xla.compile_module = counted
ts = jnp.linspace(0.0, 1.0, 5)
def solve(k):
    term = diffrax.ODETerm(lambda t, y, k: -k * y)
    return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 1.0, 0.1, jnp.ones(2), args=k,
                               saveat=diffrax.SaveAt(ts=ts)).ys
data = solve(jnp.array([0.5, 2.0]))
for _ in range(2):                      # a new loss function of the same code, as a script's loop makes one
    loopfuse.minimize(lambda k, d: jnp.mean((solve(k) - d) ** 2), jnp.ones(2), data, optax.adam(0.1), steps=5,
                      backend=loopfuse.CompiledStep())
print(count[0])
"""


@pytest.mark.slow
@pytest.mark.parametrize("on_error, compiles", [("raise", 2), ("nan", 1)])
def test_a_diffrax_solve_is_kept_where_its_error_checks_are_no_host_callbacks(on_error, compiles):
    """equinox's `error_if` is a host callback unless ``EQX_ON_ERROR=nan`` (read when equinox is imported: a
    process of its own)."""
    import os
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", _DIFFRAX_CHILD], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, EQX_ON_ERROR=on_error, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) == compiles
