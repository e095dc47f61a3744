"""The differential corpus (`corpus.PROGRAMS`) compiled by loopfuse with default options equals
``jax.jit`` of the same step bitwise: one step, and ``loop(K)`` against K ``jax.jit`` steps or the
hand-written ``jax.jit(lax.scan(...))`` (the program's `loop_reference`). Where forcing XLA's
region-analysis copy insertion changes what ``jax.jit`` computes (`REGION_ANALYSIS_UNSAFE`), forcing
it through loopfuse's `xla_options` changes loopfuse's result too: the case the default must avoid."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import loopfuse
from corpus import PROGRAMS, REGION_ANALYSIS_UNSAFE, REGION_ANALYSIS_UNSAFE_LOOPS, marked, region_analysis_triggers
from problems import assert_trees_equal, fresh, stack_trees

OPTION = "xla_cpu_copy_insertion_use_region_analysis"
K = 3


@pytest.fixture(scope="module", params=list(PROGRAMS))
def program(request):
    """The program and ``jax.jit``'s one step of it."""
    p = PROGRAMS[request.param]()
    return p, jax.jit(p.fn)(fresh(p.state), p.batch)


def _steps(fn, state, batch):
    """K ``jax.jit`` steps, aux stacked as loop(K) returns it."""
    step, auxes = jax.jit(fn), []
    for _ in range(K):
        state, aux = step(state, batch)
        auxes.append(aux)
    return state, stack_trees(auxes)


def _scan(fn, state, batch):
    """The hand-written loop: ``jax.jit`` of a ``lax.scan`` of K steps."""
    return jax.jit(lambda s, b: lax.scan(lambda c, _: fn(c, b), s, None, length=K))(state, batch)


def _differs(a, b) -> bool:
    return any(np.asarray(x).tobytes() != np.asarray(y).tobytes()
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def test_step_equals_jit(program):
    p, expected = program
    assert_trees_equal(loopfuse.compile_step(p.fn)(fresh(p.state), p.batch), expected)


def test_loop_equals_its_reference(program):
    p, _ = program
    expected = {"steps": _steps, "scan": _scan}[p.loop_reference](p.fn, fresh(p.state), p.batch)
    assert_trees_equal(loopfuse.compile_step(p.fn).loop(K)(fresh(p.state), p.batch), expected)


# fold-init puts the init before the loop, whatever the step: by default a scan and a cond, the rest -m slow
@pytest.mark.parametrize("program", marked(slow=("sort_top_k", "segment_sum_scatter_add")), indirect=True)
def test_loop_started_from_its_init_equals_its_reference(program):
    """The same loop started from an init inside its program (fold-init): the init copies the state it is given,
    the loop's program takes that state (never donated) and computes what loop(K) does on it."""
    p, _ = program
    expected = {"steps": _steps, "scan": _scan}[p.loop_reference](p.fn, fresh(p.state), p.batch)
    given = fresh(p.state)
    started = loopfuse.compile_step(p.fn).loop(K, init=lambda x, b: jax.tree_util.tree_map(jnp.copy, x))
    assert_trees_equal(started(given, p.batch), expected)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(given))


@pytest.mark.parametrize("program", REGION_ANALYSIS_UNSAFE, indirect=True)
def test_forced_region_analysis_changes_the_result(program):
    p, expected = program
    forced = loopfuse.compile_step(p.fn, xla_options={OPTION: True})(fresh(p.state), p.batch)
    assert _differs(forced, expected)


@pytest.mark.parametrize("program", ["in_place_update"], indirect=True)
def test_forced_region_analysis_changes_the_loop(program):
    """Its loop, which the gate compiles without the option (its in-place update), equals the reference (above);
    forced, the option changes it with jaxlib 0.10 (`REGION_ANALYSIS_UNSAFE_LOOPS`; 0.11+ compiles it alike)."""
    p, _ = program
    expected = {"steps": _steps, "scan": _scan}[p.loop_reference](p.fn, fresh(p.state), p.batch)
    executable = loopfuse.compile_step(p.fn).loop(K).compiled(fresh(p.state), p.batch)
    assert OPTION not in executable.xla_options
    forced = loopfuse.compile_step(p.fn, xla_options={OPTION: True}).loop(K)(fresh(p.state), p.batch)
    assert _differs(forced, expected) == ("in_place_update" in REGION_ANALYSIS_UNSAFE_LOOPS)


@pytest.mark.parametrize("name", ["nested", "donated"])
def test_forced_region_analysis_changes_jit_on_the_minimal_triggers(name):
    """The pure-lax triggers: ``jax.jit`` computes what Python says; the forced option changes it."""
    fn, args, donate, expected = region_analysis_triggers()[name]
    def run(**options):
        compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile(compiler_options=options)
        return jax.tree_util.tree_map(int, compiled(*map(jnp.asarray, args)))
    assert run() == expected
    assert run(**{OPTION: True}) != expected
