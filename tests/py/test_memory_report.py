"""Step.memory_report: the buffers live at the peak of the compiled program, each with the user's line
that made it, against the executable's own memory figures."""
import inspect
import os
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
from loopfuse import MemoryReportError, StateMismatchError
from loopfuse.memory import memory_report
from problems import fresh

OPT = optax.adam(1e-3)


def loss(params, batch):
    h = jnp.tanh(batch["x"] @ params["w1"])
    return jnp.mean((jnp.tanh(h @ params["w_big"]) @ params["w_out"] - batch["y"]) ** 2)  # the largest activation


BIG_LINE = inspect.getsourcelines(loss)[1] + 2   # its f32[256, 2048] activation and gradient, kept for the backward pass


def train_step(state, batch):
    params, opt_state = state
    value, grads = jax.value_and_grad(loss)(params, batch)
    updates, opt_state = OPT.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), {"loss": value}


def problem():
    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(16, 64)), "w_big": rng.normal(size=(64, 2048)) / 8,
              "w_out": rng.normal(size=(2048, 1)) / 45}
    params = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    batch = {"x": jnp.asarray(rng.normal(size=(256, 16)), jnp.float32), "y": jnp.zeros((256, 1), jnp.float32)}
    return (params, OPT.init(params)), batch


def check_against_stats(step, report, state, batch):
    """The report's figures against the step's executable: the same allocations, and the bytes live at
    the peak are the listed buffers' bytes, at most what the executable allocates."""
    stats = step.memory_stats(state, batch)
    assert report.stats == stats               # the report's compile allocates what the step's executable does
    assert report.notes == ()                  # XLA's buffer assignment sums to memory_stats().peak
    assert report.peak_bytes == max(report.live_bytes) == report.live_bytes[report.peak_position]
    assert report.buffers_at_peak == len(report.buffers)      # top=1000: all of them listed
    assert sum(b.bytes for b in report.buffers) == report.peak_bytes
    assert sum(b.bytes for b in report.buffers if b.kind == "temp") <= stats.temp
    assert sum(b.bytes for b in report.buffers if b.kind in ("argument", "donated")) <= stats.argument
    # what the executable allocates for the call and holds nothing live at the peak: the packing of
    # the temporaries and the output tuple's table, a few hundred bytes of 6.2 MiB here
    assert 0 <= stats.peak - report.peak_bytes < 1024


def check_largest_is_the_activation(report):
    top = report.buffers[0]
    file, line_and_function = top.source.split(":")
    assert (top.shape, top.kind, top.bytes) == ("f32[256,2048]", "temp", 256 * 2048 * 4)
    assert os.path.samefile(file, __file__) and line_and_function == f"{BIG_LINE} (loss)"
    assert all(b.bytes <= top.bytes for b in report.buffers)


def test_step_report_names_the_largest_activation_and_matches_memory_stats():
    state, batch = problem()
    step = loopfuse.compile_step(train_step, keep_aux=("loss",))
    report = step.memory_report(state, batch, top=1000)
    check_largest_is_the_activation(report)
    check_against_stats(step, report, state, batch)
    by_what = {b.what: b for b in report.buffers}
    assert by_what["state[0]['w_big']"].kind == "donated" and by_what["batch['x']"].kind == "argument"
    text = str(report)
    assert f"{BIG_LINE} (loss)" in text and "state[1][0].mu['w_big']" in text
    assert len(step.memory_report(state, batch, top=3).buffers) == 3


def test_loop_report_shows_the_carried_state():
    state, batch = problem()
    loop = loopfuse.compile_step(train_step, keep_aux=("loss",)).loop(3)
    report = loop.memory_report(state, batch, top=1000)
    check_largest_is_the_activation(report)
    check_against_stats(loop, report, state, batch)
    carried = {b.what for b in report.buffers if b.what.endswith("(loop carry)")}
    assert "state[0]['w_big'] (loop carry)" in carried and "state[1][0].nu['w_big'] (loop carry)" in carried


def test_a_rolled_program_names_the_state_it_writes_in_place():
    """The backward loop writes each layer's new rows into the donated stacked buffers: those buffers are
    the state's, named by its path and the op that wrote them (not by that op alone)."""
    import layered
    step, state, batch = layered.rms_mlp(4, 32, 128)
    report = loopfuse.compile_step(step, memory_budget=0.0).memory_report(
        loopfuse.pack(fresh(state), layers=True), batch, top=1000)
    donated = [b.what for b in report.buffers if b.kind == "donated"]
    assert donated and all(w.startswith("state.") for w in donated), donated
    assert any(w.startswith("state.buffers[") and ", written in place by " in w for w in donated), donated


def test_a_diffrax_solve_is_named_by_the_users_line():
    """Some buffers of an adaptive ODE solve inside the loss (an SIR model, as fitted with Adam) are made in
    equinox's code that diffrax calls: the report names the line of this file that calls the solve."""
    import diffrax

    def field(t, y, rates):
        (beta, gamma), (s, i, _) = rates, y
        return jnp.stack([-beta * s * i, beta * s * i - gamma * i, gamma * i])

    def loss(u, data):
        ys = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Tsit5(), 0.0, 20.0, 0.1, jnp.array([0.99, 0.01, 0.0]),
                                 args=(2.0 * jax.nn.sigmoid(u[0]), jax.nn.sigmoid(u[1])),
                                 saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 20.0, 21)),
                                 stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-7), max_steps=2048).ys
        return jnp.mean((ys[:, 1] - data) ** 2)

    opt = optax.adam(5e-2)

    def step(state, data):
        u, s = state
        value, grad = jax.value_and_grad(loss)(u, data)
        updates, s = opt.update(grad, s, u)
        return (optax.apply_updates(u, updates), s), {"loss": value}
    u = jnp.array([0.0, -1.0])
    report = loopfuse.compile_step(step).memory_report((u, opt.init(u)), jnp.zeros(21), top=8)
    sources = [b.source for b in report.buffers if b.source]
    assert sources and all(os.path.samefile(s.split(":")[0], __file__) for s in sources), sources


def test_dump_holds_the_report_and_its_timeline(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    read_from = []
    read = memory_report.read
    monkeypatch.setattr(memory_report, "read", lambda folder, *a: read_from.append(folder) or read(folder, *a))
    state, batch = problem()
    step = loopfuse.compile_step(train_step, keep_aux=("loss",), dump_ir=tmp_path / "dump")
    report = step.memory_report(state, batch)
    assert read_from[0].parent == tmp_path / "tmp" and os.listdir(tmp_path / "tmp") == []   # XLA's dump is gone
    [folder] = (tmp_path / "dump").iterdir()
    assert (folder / "memory-report.txt").read_text() == str(report)
    root = ET.parse(folder / "memory-timeline.svg").getroot()
    [polyline] = root.iter("{http://www.w3.org/2000/svg}polyline")
    assert len(polyline.get("points").split()) == 2 * len(report.live_bytes)   # a step per schedule position
    labels = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert any(f"{BIG_LINE} (loss)" in (t or "") for t in labels) and any("peak" in (t or "") for t in labels)
    assert step.compile_count == 0


def test_bad_state_raises_before_compiling_and_keeps_the_state():
    state, batch = problem()
    step = loopfuse.compile_step(train_step, keep_aux=("loss",))
    with pytest.raises(StateMismatchError, match=r"state leaf \[2\] is ndarray"):
        step.memory_report((*state, np.array(["not an array"])), batch)
    with pytest.raises(ValueError, match="top must be a positive int"):
        step.memory_report(state, batch, top=0)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state))
    new_state, aux = step(state, batch)
    assert np.isfinite(aux["loss"])


def test_a_dump_without_live_ranges_is_a_clear_error(tmp_path):
    (tmp_path / "module_0001.jit_flat.cpu_after_optimizations.txt").write_text("HloModule jit_flat\n")
    with pytest.raises(MemoryReportError, match="wrote no buffer assignment"):
        memory_report.read(tmp_path, loopfuse.MemoryStats(0, 0, 0, 0), "cpu")
    buffers = "allocation 0: size 4, preallocated-temp:\n value: <1 a @0> (size=4,offset=0): f32[]\n"
    (tmp_path / "module_0001.jit_flat.cpu_after_optimizations-buffer-assignment.txt").write_text(buffers)
    with pytest.raises(MemoryReportError, match="xla_dump_buffer_assignment_analysis"):
        memory_report.read(tmp_path, loopfuse.MemoryStats(0, 0, 0, 0), "cpu")
