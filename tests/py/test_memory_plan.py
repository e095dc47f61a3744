"""memory_limit (``compile_step(fn, memory_limit=...)``) and `largest_batch`: the remat budget and micro-batch
count whose compiled peak fits a limit, chosen from compiled figures (XLA's arguments + outputs - aliased +
temporaries); nothing runs while choosing.

The models are small residual MLPs written as a Python loop over alike layers (roll-layers rolls them) whose
loss is a mean over the examples (micro-batch cuts it), one with batch norm (micro-batch refuses it). The
sweeps choose over one `memory_plan.Programs` (each program compiled once, the choice the same as a fresh
``compile_step`` makes: its predictions do not depend on what was compiled before, see `memory_plan`)."""
import inspect
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import loopfuse
import transformer
from loopfuse.compile import compiler
from loopfuse.memory import memory_plan
from loopfuse.compile.options import StepOptions
from loopfuse.state.packed import on_packed
from problems import fresh

OPT = optax.adam(1e-3, eps=1e-5)


def params(layers: int = 4, width: int = 16, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    p = {"w_in": rng.normal(size=(8, width)) / 3, "w_out": rng.normal(size=(width, 1)) / width**0.5,
         "layers": [{"w": rng.normal(size=(width, width)) / width**0.5, "b": np.zeros(width)} for _ in range(layers)]}
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), p)


def make_batch(rows: int, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(rows, 8)).astype(np.float32), "y": rng.normal(size=(rows, 1)).astype(np.float32)}


def mlp_loss(p, batch):
    x = jnp.tanh(batch["x"] @ p["w_in"])
    for layer in p["layers"]:
        x = x + jnp.tanh(x @ layer["w"] + layer["b"])
    return jnp.mean((x @ p["w_out"] - batch["y"]) ** 2)


def bn_loss(p, batch):
    x = jnp.tanh(batch["x"] @ p["w_in"])
    for layer in p["layers"]:
        h = x @ layer["w"] + layer["b"]
        h = (h - h.mean(0)) * lax.rsqrt(h.var(0) + 1e-5)      # batch norm: the statistics of the whole batch
        x = x + jnp.tanh(h)
    return jnp.mean((x @ p["w_out"] - batch["y"]) ** 2)


BN_LINE = inspect.getsourcelines(bn_loss)[1] + 4


def deep_loss(p, batch):
    """`mlp_loss` with two activations a layer that the backward ops read: rolling saves memory in a slice too."""
    x = jnp.tanh(batch["x"] @ p["w_in"])
    for layer in p["layers"]:
        x = x + jnp.tanh(2.0 * jnp.tanh(x @ layer["w"] + layer["b"]))
    return jnp.mean((x @ p["w_out"] - batch["y"]) ** 2)


def problem(loss=mlp_loss, rows: int = 64):
    p = params()
    return transformer.optax_step(loss, OPT), (p, OPT.init(p)), make_batch(rows)


def programs_of(step, state, batch, **options):
    """The `memory_plan.Programs` of a step and its plans, as `memory_plan.build` makes them."""
    opts = StepOptions(**options)
    plans = memory_plan.candidates(opts, compiler.slice_counts(batch, None))
    return memory_plan.Programs.traced(step, opts, state, batch, {}), plans


def sweep(programs, plans, limits) -> dict:
    """limit -> the chosen MemoryPlan, or the Floor where none fits."""
    return {limit: memory_plan.choose(programs, limit, plans) for limit in limits}


@pytest.mark.slow      # ~10 s on 2 cores (the default suite's time)
def test_a_falling_limit_never_gets_a_higher_peak_and_below_the_floor_is_an_error(tmp_path):
    step, state, batch = problem()
    programs, plans = programs_of(step, state, batch, cache_dir=tmp_path)   # the fresh compiles below load them
    traced = programs.compiled(memory_plan.TRACED).memory.peak
    limits = [int(traced * 1.05 * 0.8**i) for i in range(16)]              # from over the traced peak to far below
    found = sweep(programs, plans, limits)
    chosen = [(limit, f) for limit, f in found.items() if isinstance(f, memory_plan.MemoryPlan)]
    floors = [f for f in found.values() if isinstance(f, memory_plan.Floor)]
    assert chosen[0][1].chosen == memory_plan.TRACED and floors, [str(f) for f in found.values()]
    peaks = [f.stats.peak for _, f in chosen]
    assert all(f.stats.peak <= limit for limit, f in chosen)
    assert peaks == sorted(peaks, reverse=True)                              # never rises as the limit falls
    assert len({f.chosen for _, f in chosen}) >= 3                           # several plans along the way
    floor = floors[0]
    assert all(f.stats.peak == floor.stats.peak and f.plan == floor.plan for f in floors)
    assert floor.stats.peak <= peaks[-1] and floor.limit < floor.stats.peak   # the floor: the least peak reached
    at_floor = memory_plan.choose(programs, floor.stats.peak, plans)            # and a limit of exactly it is met
    assert isinstance(at_floor, memory_plan.MemoryPlan) and at_floor.stats.peak == floor.stats.peak
    assert programs.compiles <= 12, programs.compiles                       # a few per limit, not a sweep of each
    # a fresh compile_step chooses what the sweep chose, and names the floor and its buffers below it
    limit, plan = chosen[len(chosen) // 2]
    executable = loopfuse.compile_step(step, memory_limit=limit, cache_dir=tmp_path).compiled(fresh(state), batch)
    assert executable.memory_plan.chosen == plan.chosen and executable.memory.peak == plan.stats.peak
    with pytest.raises(loopfuse.MemoryLimitError) as error:
        loopfuse.compile_step(step, memory_limit=floor.limit, cache_dir=tmp_path).compiled(fresh(state), batch)
    assert error.value.floor == floor.stats.peak and error.value.plan == str(floor.plan)
    text = str(error.value)
    shown = [memory_plan.size_text(n) for n in (floor.limit, floor.stats.peak)]
    if shown[0] == shown[1]:                  # a limit just under the floor: the bytes tell them apart
        shown = [f"{n:,} B" for n in (floor.limit, floor.stats.peak)]
    assert f"memory_limit {shown[0]} is below the floor of this step: the least peak of any plan is {shown[1]}" \
        in text and "largest buffers live at its peak:" in text
    with pytest.raises(loopfuse.MemoryLimitError, match=f"memory_limit {floor.stats.peak - 1:,} B is below the floor "
                                                        f"of this step: the least peak of any plan is {floor.stats.peak:,} B"):
        loopfuse.compile_step(step, memory_limit=floor.stats.peak - 1, cache_dir=tmp_path).compiled(fresh(state), batch)
    buffers = text.split("live at its peak:\n")[1].split("\npeak:")[0].splitlines()
    assert len(buffers) == memory_plan.FLOOR_BUFFERS and all(re.match(r"  [0-9.]+ [KM]?i?B f32\[", b) for b in buffers)


@pytest.mark.slow     # a regression of the prediction formula; the default run has the floor and the predictions
def test_no_prediction_is_below_zero_and_a_limit_below_every_plan_is_the_floor():
    """Regression: a plan that rolls and slices was predicted at T(b) / m + W(b, m) - W(b), below zero where
    the rolled loops' saved layers (W(b)) outweigh the temporaries of a slice; the floor, chosen among the
    plans near the least prediction, then had none (a ValueError from `min`)."""
    step, state, batch = problem(deep_loss, rows=256)
    state = loopfuse.pack(state, layers=True)          # so that the layers roll at this size, sliced too
    programs, plans = programs_of(on_packed(step, state.layout), state, batch)
    floor = memory_plan.choose(programs, 1, plans)
    assert isinstance(floor, memory_plan.Floor) and floor.stats.peak > 1
    rolled_and_sliced = [c for c in plans if c.budget < 1.0 and c.slices > 1 and programs.is_lowered(c)
                         and programs.same_as(c) is None]
    assert rolled_and_sliced                           # the plans the old form went wrong on are here
    assert all(programs.predicted(c) >= 0 for c in plans if programs.predicted(c) is not None)


@pytest.mark.slow
def test_micro_batch_predictions_are_close_and_the_chosen_plan_runs_within_tolerance(tmp_path):
    """The model's prediction of a plan in slices against XLA's figures; the plan chosen runs, its loss and
    state against jax.jit's (micro-batches reassociate the gradient's sums: test_micro_batch's tolerance)."""
    step, state, batch = problem()
    programs, plans = programs_of(step, state, batch)
    traced = programs.compiled(memory_plan.TRACED).memory.peak
    for m in (2, 8):
        c = memory_plan.Candidate(1.0, m)
        predicted = programs.predicted(c)
        compiled = programs.compiled(c).memory.peak
        assert abs(predicted - compiled) <= 0.15 * compiled, (m, predicted, compiled)
    call = loopfuse.compile_step(step, memory_limit=traced // 2, dump_ir=tmp_path)
    executable = call.compiled(fresh(state), batch)
    chosen = executable.memory_plan.chosen
    assert chosen.slices > 1 and executable.memory.peak <= traced // 2
    assert "memory-limit" in executable.reports and str(chosen) in executable.reports["memory-limit"]
    assert [p.read_text() for p in tmp_path.glob("*/memory-limit.txt")] == [executable.reports["memory-limit"] + "\n"]
    assert f"loopfuse.micro_batch = {chosen.slices}" in call.lower(fresh(state), batch)["final"]   # its program
    report = call.memory_report(fresh(state), batch)
    assert any(note.startswith(f"memory_limit {memory_plan.size_text(traced // 2)}: {chosen}") for note in report.notes)
    s, reference = fresh(state), fresh(state)
    for _ in range(3):
        s, aux = call(s, batch)
        reference, ref_aux = jax.jit(step)(reference, batch)
    assert abs(float(aux["loss"]) - float(ref_aux["loss"])) <= 1e-5 * abs(float(ref_aux["loss"]))
    for x, y in zip(jax.tree_util.tree_leaves(s), jax.tree_util.tree_leaves(reference)):
        assert np.max(np.abs(np.asarray(x) - np.asarray(y))) <= 1e-5 * np.max(np.abs(np.asarray(y))) + 1e-6


@pytest.mark.slow
def test_batch_norm_refuses_slices_with_its_line_and_the_limit_is_met_by_remat(tmp_path):
    """The layers kept stacked (`loopfuse.pack(state, layers=True)`), so that they roll at this small size."""
    step, state, batch = problem(bn_loss, rows=256)
    state = loopfuse.pack(state, layers=True)
    traced = loopfuse.compile_step(step, cache_dir=tmp_path).memory_stats(state, batch).peak
    executable = loopfuse.compile_step(step, memory_limit=int(0.9 * traced), cache_dir=tmp_path).compiled(state, batch)
    plan = executable.memory_plan
    assert plan.chosen.budget < 1.0 and plan.chosen.slices == 1 and executable.memory.peak <= 0.9 * traced
    assert not [c for c in plan.considered if c.plan.slices > 1]         # a plan in one slice fits: none tried
    with pytest.raises(loopfuse.MemoryLimitError, match=r"the least peak of any plan is .* \(memory_budget=") as error:
        loopfuse.compile_step(step, memory_limit=traced // 4, cache_dir=tmp_path).compiled(state, batch)
    assert error.value.floor > traced // 4
    declined = [line for line in str(error.value).splitlines() if re.search(r"micro_batches=2\b", line)]
    assert len(declined) == 1 + len(memory_plan.BUDGETS), declined      # each budget's slices, declined once
    assert all("declined: did not micro-batch: stablehlo." in line and f"(test_memory_plan.py:{BN_LINE})" in line
               and "(so with 4 to 256 slices)" in line for line in declined), declined


@pytest.mark.slow
def test_largest_batch_fits_and_twice_it_does_not_in_log_compiles(tmp_path):
    step, state, _ = problem()
    limit = loopfuse.compile_step(step, memory_budget=0.0).memory_stats(fresh(state), make_batch(96)).peak
    cached = loopfuse.compile_step(step, cache_dir=tmp_path)            # the checks below load its programs
    fit = loopfuse.largest_batch(cached, state, make_batch, memory_limit=limit, max_batch=1024)
    n = fit.batch_size
    assert n == 64 and not fit.capped and fit.probes[n] <= limit < fit.probes[2 * n], fit
    assert fit.plan.stats.peak <= limit
    # the figures again, from fresh compiles: the plan fits at n, the least plan does not at 2n
    again = loopfuse.compile_step(step, memory_limit=limit, cache_dir=tmp_path).compiled(fresh(state), make_batch(n))
    assert again.memory_plan.chosen == fit.plan.chosen
    least = loopfuse.compile_step(step, memory_budget=0.0, cache_dir=tmp_path)
    assert least.memory_stats(fresh(state), make_batch(2 * n)).peak > limit
    probes = math.ceil(math.log2(10 + 2))            # a binary search over the 11 sizes 1 .. 1024
    assert len(fit.probes) <= probes and fit.compiles <= probes + 3, fit
    with pytest.raises(loopfuse.MemoryLimitError, match="below the floor"):
        loopfuse.largest_batch(cached, state, make_batch, memory_limit=1024, max_batch=8)


def test_largest_batch_names_the_plan_compile_step_chooses_and_checks_the_rows(tmp_path):
    """The answer's plan is the one `compile_step(..., memory_limit=...)` chooses there, whatever order the search
    lowered the plans in (it lowered the least-memory plan first, and a step whose rolling changes nothing was
    answered "memory_budget=0, micro_batches=2" where compile_step says "micro_batches=2"); a `make_batch` that
    ignores its size is refused (every probe measured its one batch, and the answer did not fit)."""
    d = 128
    p = {"w1": jnp.ones((d, d)) / d, "w2": jnp.ones((d, 1)) / d}
    opt = optax.adam(1e-3)

    def step(state, b):
        loss, g = jax.value_and_grad(lambda p: jnp.mean((jnp.tanh(b["x"] @ p["w1"]) @ p["w2"] - b["y"]) ** 2))(state[0])
        u, o = opt.update(g, state[1], state[0])
        return (optax.apply_updates(state[0], u), o), {"loss": loss}
    state = (p, opt.init(p))
    make = lambda n: {"x": jnp.ones((n, d)), "y": jnp.ones((n, 1))}       # noqa: E731
    sliced = loopfuse.compile_step(step, micro_batches=2, cache_dir=tmp_path)
    fit = loopfuse.largest_batch(sliced, state, make, "2MiB", max_batch=1024)
    chosen = loopfuse.compile_step(step, micro_batches=2, memory_limit="2MiB", cache_dir=tmp_path).compiled(
        fresh(state), make(fit.batch_size)).memory_plan
    assert fit.plan.chosen == chosen.chosen == memory_plan.Candidate(1.0, 2), (str(fit.plan), str(chosen))
    fixed = make(8)
    with pytest.raises(ValueError, match=r"make_batch\(\d+\) returned a batch without \d+ examples \(its leaves' axes: \[1, 8, 128\]\)"):
        loopfuse.largest_batch(sliced, state, lambda n: fixed, "2MiB", max_batch=1024)
    time_major = loopfuse.largest_batch(lambda w, b: (w - 0.1 * jnp.mean(b, axis=(0, 1)) * w, {}), jnp.ones(4),
                                        lambda n: jnp.ones((5, n, 4)), "1GiB", max_batch=8)
    assert time_major.batch_size == 8                    # the examples' axis need not be the first
    # a budget given for a step with no layers: its one plan is the step as traced's program (it found no plan)
    given = loopfuse.compile_step(lambda w, b: (w - 0.1 * jnp.mean(b) * w, {}), memory_budget=0.5, micro_batches=1)
    assert loopfuse.largest_batch(given, jnp.ones(4), lambda n: jnp.ones((n, 4)), "1GiB",
                                  max_batch=8).plan.chosen == memory_plan.Candidate(0.5, 1)


def test_the_options_it_takes_and_refuses():
    step, state, batch = problem()
    for given, bytes_ in (("2GiB", 2 << 30), ("512 MiB", 512 << 20), ("1.5GB", 1_500_000_000), (4096, 4096),
                          (2e9, 2_000_000_000)):
        assert StepOptions(memory_limit=given).memory_limit == bytes_
    assert StepOptions(memory_limit="device").memory_limit == "device"
    with pytest.raises(ValueError, match=r'memory_limit must be bytes, a size such as "2GiB" or "512 MiB", or '
                                         r'"device"; got \'2 gigs\''):
        loopfuse.compile_step(step, memory_limit="2 gigs")
    with pytest.raises(TypeError, match="memory_limit must be bytes"):
        loopfuse.compile_step(step, memory_limit=True)
    with pytest.raises(ValueError, match=r"CompiledLoop\(memory_limit=...\) must be at least 1 byte, got 0"):
        loopfuse.CompiledLoop(memory_limit=0)
    assert loopfuse.CompiledStep(memory_limit="1GiB").compile_options() == {"memory_limit": 1 << 30}
    with pytest.raises(ValueError, match=r'memory_limit="device": cpu device 0 reports no memory limit .* pass the '
                                         r'bytes instead'):
        loopfuse.compile_step(step, memory_limit="device").compiled(fresh(state), batch)
    # a budget given beside the limit is kept (the slices are chosen), and the slices given are kept
    budget = loopfuse.compile_step(step, memory_limit=1 << 30, memory_budget=0.0).compiled(fresh(state), batch)
    assert budget.memory_plan.chosen == memory_plan.Candidate(0.0, 1)
    assert [c.plan for c in budget.memory_plan.considered] == [memory_plan.Candidate(0.0, 1)]
    assert memory_plan.candidates(StepOptions(), [2])[:6] == [       # the fewest slices, then the least recompute
        *(memory_plan.Candidate(b, 1) for b in (1.0, *memory_plan.BUDGETS)), memory_plan.Candidate(1.0, 2)]
    assert memory_plan.candidates(StepOptions(memory_budget=0.0), [2, 4]) == [
        memory_plan.Candidate(0.0, m) for m in (1, 2, 4)]
    assert memory_plan.candidates(StepOptions(micro_batches=4), [2, 4, 8]) == [
        memory_plan.Candidate(b, 4) for b in (1.0, *memory_plan.BUDGETS)]


@pytest.mark.slow
def test_loop_fit_minimize_and_verify_take_the_limit():
    step, state, batch = problem()
    traced = loopfuse.compile_step(step).loop(2).memory_stats(fresh(state), batch).peak
    loop = loopfuse.compile_step(step, keep_aux=("loss",), memory_limit=traced // 2, verify=True).loop(2)
    assert loop.compiled(fresh(state), batch).memory_plan.chosen.slices > 1     # a loop plans its own program
    loop(fresh(state), batch)                                 # verify holds the chosen plan to its tolerance
    data = loopfuse.Dataset(make_batch(128), batch_size=64)       # its arrays are arguments of the program
    on_data = loopfuse.compile_step(step).loop(2).memory_stats(fresh(state), data).peak
    limited = loopfuse.compile_step(step, keep_aux=("loss",), memory_limit=on_data * 3 // 4)
    result = loopfuse.fit(limited, fresh(state), data, 4, chunk=2, progress=False)
    assert result.steps == 4 and np.all(np.isfinite(result.history["loss"]))
    assert limited.loop(2).compiled(fresh(state), data).memory_plan.chosen.slices > 1

    def loss(p, b):
        return mlp_loss(p, b)
    sol = loopfuse.minimize(loss, params(), data=batch, optimizer=OPT, steps=4,
                            backend=loopfuse.CompiledLoop(steps=2, memory_limit=traced // 2))
    assert sol.steps == 4 and np.isfinite(sol.loss_history).all()


@pytest.mark.slow
def test_gpt_sweep_of_fresh_compiles_is_monotone(tmp_path):
    """Issue 31's GPT, small: every limit a fresh compile_step (the compile cache shared), peaks within each
    limit and never rising as it falls; below the floor, the error."""
    step, state, tokens = transformer.gpt(**dict(transformer.TINY, seq=64, batch=16))
    traced = loopfuse.compile_step(step).memory_stats(fresh(state), tokens).peak
    peaks, floor = [], None
    for i in range(10):
        limit = int(traced * 0.7**i)
        try:
            call = loopfuse.compile_step(step, memory_limit=limit, cache_dir=tmp_path)
            executable = call.compiled(fresh(state), tokens)
        except loopfuse.MemoryLimitError as e:
            floor = e.floor
            assert floor > limit and peaks and floor <= peaks[-1], (floor, peaks)
            break
        assert executable.memory.peak <= limit
        peaks.append(executable.memory.peak)
    assert floor is not None and peaks == sorted(peaks, reverse=True)
