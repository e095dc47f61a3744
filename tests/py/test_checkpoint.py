"""fit/minimize checkpoints (orbax): resume bitwise, refuse another program's, survive SIGKILL."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import loopfuse
import loopfuse.drivers.chunks
import loopfuse.state.checkpoint
from checkpoint_child import CHUNK, EVERY, fit, problem, raw, until_ten
from loopfuse.drivers.backends import CompiledLoop, CompiledStep, GradOnly

pytest.importorskip("orbax.checkpoint", reason="checkpoints need the 'checkpoint' extra (orbax-checkpoint)")
CHILD = Path(__file__).with_name("checkpoint_child.py")


@pytest.fixture(scope="module")
def step():
    return loopfuse.compile_step(problem()[0])


@pytest.fixture(scope="module")
def whole(step, tmp_path_factory):
    """An uninterrupted checkpointed fit of 24 steps."""
    return fit(tmp_path_factory.mktemp("whole"), 24, step)


def _assert_bitwise(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(raw(a), raw(b)):
        np.testing.assert_array_equal(x, y)


def _steps(directory) -> list[int]:
    """The steps of the complete checkpoints in `directory` (orbax renames a finished save to its step)."""
    return sorted(int(p.name) for p in Path(directory).glob("*") if p.name.isdigit())


def test_resume_runs_the_remaining_steps_bitwise(step, whole, tmp_path):
    first = fit(tmp_path, 16, step)
    assert first.resumed_from == 0 and _steps(tmp_path) == [8, 12, 16]         # every 4, keep=3
    resumed = fit(tmp_path, 24, step)
    assert resumed.resumed_from == 16 and resumed.steps == 24 and not resumed.interrupted
    _assert_bitwise(resumed.state, whole.state)                                 # the Dataset order continued
    np.testing.assert_array_equal(resumed.history["loss"], whole.history["loss"])
    assert resumed.history["loss"].shape == (24,) and _steps(tmp_path) == [16, 20, 24]
    done = fit(tmp_path, 24, step)                                              # nothing left to run
    assert done.resumed_from == 24 and done.steps == 24
    _assert_bitwise(done.state, whole.state)
    np.testing.assert_array_equal(done.history["loss"], whole.history["loss"])


def test_an_interrupted_or_failed_fit_resumes_from_its_last_checkpoint(step, whole, tmp_path):
    fn, state, data = problem()

    def fail(done, aux):
        if done == 11:              # chunks end at 3, 4, 7, 8, 11, 12, ...: cut at every 4th step
            raise RuntimeError("preempted")

    with pytest.raises(loopfuse.FitError) as info:
        loopfuse.fit(step, state, data, 24, chunk=CHUNK, progress=False, callback=fail, checkpoint_dir=tmp_path,
                     checkpoint_every=EVERY)
    assert info.value.result.steps == 11 and _steps(tmp_path) == [4, 8]
    resumed = fit(tmp_path, 24, step)
    assert resumed.resumed_from == 8
    _assert_bitwise(resumed.state, whole.state)


def test_ctrl_c_saves_the_steps_it_stopped_at_and_a_second_one_waits_for_that_save(step, whole, tmp_path, monkeypatch):
    """A Ctrl-C saves the state it stopped at (it saved none: a re-run redid up to an interval), and a second
    one while that save is written is dropped (it raised out of orbax's wait, losing the result and the save)."""
    fn, state, data = problem()
    close = loopfuse.state.checkpoint.Checkpoints.close

    def close_with_a_second_ctrl_c(self):
        os.kill(os.getpid(), signal.SIGINT)
        close(self)

    monkeypatch.setattr(loopfuse.state.checkpoint.Checkpoints, "close", close_with_a_second_ctrl_c)

    def ctrl_c(done, aux):
        if done == 11:              # chunks end at 3, 4, 7, 8, 11, 12, ...: between the saves of 8 and 12
            os.kill(os.getpid(), signal.SIGINT)

    result = loopfuse.fit(step, state, data, 24, chunk=CHUNK, progress=False, callback=ctrl_c,
                          checkpoint_dir=tmp_path, checkpoint_every=EVERY)
    assert result.interrupted and result.steps == 11 and _steps(tmp_path) == [4, 8, 11]
    monkeypatch.setattr(loopfuse.state.checkpoint.Checkpoints, "close", close)
    resumed = fit(tmp_path, 24, step)
    assert resumed.resumed_from == 11
    _assert_bitwise(resumed.state, whole.state)
    np.testing.assert_array_equal(resumed.history["loss"], whole.history["loss"])


@pytest.mark.parametrize("damage", ["meta", "state"])
def test_a_damaged_latest_checkpoint_is_named_with_the_one_before_it(step, whole, tmp_path, damage):
    """A checkpoint damaged after it was written (its meta cut, its state item gone) raised orbax's, json's or
    tensorstore's own error; it is a CheckpointError naming it and the checkpoint before it, nothing changed,
    and with it moved away the run resumes bitwise from the one before."""
    fit(tmp_path, 12, step)
    if damage == "meta":
        (tmp_path / "12" / "meta" / "metadata").write_text("{garbage")
    else:
        shutil.rmtree(tmp_path / "12" / "state")
    fn, state, data = problem()
    with pytest.raises(loopfuse.CheckpointError, match=r"the checkpoint of step 12 in .* cannot be read \(.*\); if it is "
                       r"damaged, move 12 out of the folder to resume from the checkpoint before it \(step 8\)"):
        loopfuse.fit(step, state, data, 24, chunk=CHUNK, progress=False, checkpoint_dir=tmp_path, checkpoint_every=EVERY)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state)) and _steps(tmp_path) == [4, 8, 12]
    shutil.move(tmp_path / "12", tmp_path.parent / f"{tmp_path.name}-damaged-12")
    resumed = fit(tmp_path, 24, step)
    assert resumed.resumed_from == 8
    _assert_bitwise(resumed.state, whole.state)


def test_a_second_run_into_the_same_folder_is_refused_while_the_first_runs(step, whole, tmp_path):
    """Two runs checkpointing into one folder interleaved their saves and deletions and failed inside orbax or
    tensorstore; the second is a ValueError saying the folder is in use, and a run that failed before its first
    chunk leaves it free."""
    fn, state, data = problem()

    def second_run(done, aux):
        if done == 4:
            with pytest.raises(ValueError, match=r"is in use: another run checkpoints into it now"):
                fit(tmp_path, 24, step)

    first = loopfuse.fit(step, state, data, 24, chunk=CHUNK, progress=False, callback=second_run,
                         checkpoint_dir=tmp_path, checkpoint_every=EVERY)
    _assert_bitwise(first.state, whole.state)
    with pytest.raises(TypeError):      # fails compiling, after its checkpoints were opened
        loopfuse.fit(step, state, {"x": jnp.ones((3, 3))}, 30, chunk=CHUNK, progress=False, checkpoint_dir=tmp_path)
    assert fit(tmp_path, 24, step).resumed_from == 24


def test_a_queued_fit_saves_each_checkpoint_from_its_own_state(step, whole, tmp_path, monkeypatch):
    """Chunks are queued on the device, but a chunk whose checkpoint is due is read back before the next
    one consumes its state: resumed from a checkpoint before the last, the run ends bitwise as a whole."""
    monkeypatch.setattr(loopfuse.drivers.chunks, "CHAIN_SECONDS", 60.0)     # queue all the chunks it may
    fit(tmp_path, 24, step, keep=None)
    assert _steps(tmp_path) == [4, 8, 12, 16, 20, 24]
    for later in (16, 20, 24):
        shutil.rmtree(tmp_path / str(later))
    resumed = fit(tmp_path, 24, step)
    assert resumed.resumed_from == 12
    _assert_bitwise(resumed.state, whole.state)
    np.testing.assert_array_equal(resumed.history["loss"], whole.history["loss"])


def _snapshot(directory) -> dict:
    return {str(p): p.stat().st_mtime_ns for p in Path(directory).rglob("*")}


@pytest.mark.parametrize("change, match", [
    (lambda s: (dict(s[0], w=s[0]["w"][:4]),) + s[1:], r"state leaf \[0\]\['w'\] is float32\[8, 32\] there, "
                                                      r"float32\[4, 32\] here"),
    (lambda s: (dict(s[0], b=s[0]["b"].astype(jnp.bfloat16)),) + s[1:], r"\[0\]\['b'\] is float32\[32\] there, "
                                                                         r"bfloat16\[32\] here"),
    (lambda s: (dict(s[0], extra=jnp.zeros(3)),) + s[1:], r"\[0\]\['extra'\] is in this state, not in the checkpoint"),
    (lambda s: s[:2], r"\[2\] is in the checkpoint, not in this state"),
])
def test_a_checkpoint_of_another_program_is_refused_and_kept(step, tmp_path, change, match):
    fit(tmp_path, 8, step)
    before = _snapshot(tmp_path)
    fn, state, data = problem()
    with pytest.raises(loopfuse.StateMismatchError, match=match + ".*nothing was overwritten"):
        loopfuse.fit(loopfuse.compile_step(fn), change(state), data, 16, chunk=CHUNK, progress=False,
                     checkpoint_dir=tmp_path, checkpoint_every=EVERY)
    assert _snapshot(tmp_path) == before


def test_a_checkpoint_with_more_steps_than_num_steps_is_refused(step, tmp_path):
    fit(tmp_path, 8, step)
    before = _snapshot(tmp_path)
    with pytest.raises(loopfuse.StateMismatchError, match="has run 8 steps, more than num_steps=6"):
        fit(tmp_path, 6, step)
    assert _snapshot(tmp_path) == before


def test_another_aux_structure_is_refused(step, tmp_path):
    fit(tmp_path, 4, step)
    fn, state, data = problem()
    with pytest.raises(loopfuse.StateMismatchError, match=r"aux history has paths \[\"\['loss'\]\"\]"):
        loopfuse.fit(loopfuse.compile_step(lambda s, b: (fn(s, b)[0], {})), state, data, 8, chunk=CHUNK,
                     progress=False, checkpoint_dir=tmp_path, checkpoint_every=EVERY)


# One chunk driver saves and restores for every backend: by default the loop's (chunks cut at the saves).
@pytest.mark.parametrize("backend", [pytest.param(GradOnly(), marks=pytest.mark.slow),
                                     pytest.param(CompiledStep(), marks=pytest.mark.slow), CompiledLoop(steps=3)],
                         ids=["grad-only", "step", "loop3"])
def test_minimize_resumes_bitwise(backend, tmp_path):
    loss = lambda p, batch: jnp.mean((batch[0] @ p["w"] + p["b"] - batch[1]) ** 2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype(np.float32)
    data, params = (x, x @ np.ones(3, np.float32)), {"w": jnp.zeros(3), "b": jnp.zeros(())}
    run = lambda d, n: loopfuse.minimize(loss, params, data, optax.adam(0.1), n, backend=backend,
                                         checkpoint_dir=d, checkpoint_every=4)
    whole = run(tmp_path / "whole", 14)
    run(tmp_path / "split", 9)
    resumed = run(tmp_path / "split", 14)
    _assert_bitwise(resumed.params, whole.params)
    np.testing.assert_array_equal(resumed.loss_history, whole.loss_history)
    assert _steps(tmp_path / "split") == [9, 12, 14]             # 9: the end of the first run


def _kill_at_random_moments(directory, kills: int, num_steps: int, seed: int, within: float = 1.0,
                            pace: float = 0.0) -> int:
    """Start fits of `num_steps` on `directory` one after another and SIGKILL each at a random moment
    up to `within` seconds after it saved a new checkpoint (mostly during a later save); each child
    sleeps `pace` seconds after each chunk. Return how many kills landed (the child was still running)."""
    rng, landed = np.random.default_rng(seed), 0
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    for _ in range(kills):
        saved = max(_steps(directory), default=0)
        child = subprocess.Popen([sys.executable, str(CHILD), "run", str(directory), str(num_steps), str(pace)],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert child.stdout.readline() == "ready\n"
            deadline = time.monotonic() + 120
            while child.poll() is None and max(_steps(directory), default=0) <= saved:
                assert time.monotonic() < deadline, "the child saved no checkpoint in 120 s"
                time.sleep(0.01)
            time.sleep(rng.uniform(0, within))
            child.send_signal(signal.SIGKILL)
            landed += child.wait(timeout=60) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=60)
    return landed


def _assert_resumes_bitwise(directory, whole, num_steps):
    resumed = fit(directory, num_steps)
    assert resumed.steps == num_steps
    _assert_bitwise(resumed.state, whole.state)
    np.testing.assert_array_equal(resumed.history["loss"], whole.history["loss"])
    return resumed


@pytest.mark.parametrize("kills", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_sigkill_at_random_moments_leaves_a_restorable_checkpoint(tmp_path, kills):
    """Every kill lands mid-run: each child sleeps 0.15 s after each 3-step chunk, so the 48 steps
    outlast up to three kills that each come at most 0.5 s after a new save, on any machine."""
    num_steps = 48
    whole = fit(tmp_path / "whole", num_steps)
    landed = _kill_at_random_moments(tmp_path / "killed", kills, num_steps, seed=0, within=0.5, pace=0.15)
    last = max(_steps(tmp_path / "killed"))
    resumed = _assert_resumes_bitwise(tmp_path / "killed", whole, num_steps)
    assert landed == kills and 0 < resumed.resumed_from == last < num_steps, (landed, resumed.resumed_from, last)


@pytest.mark.slow
def test_sigkill_soak(tmp_path):
    num_steps = 400
    whole = fit(tmp_path / "whole", num_steps)
    landed = _kill_at_random_moments(tmp_path / "killed", 20, num_steps, seed=1)
    assert landed >= 10
    _assert_resumes_bitwise(tmp_path / "killed", whole, num_steps)


@pytest.mark.slow      # ~10 s on 2 cores (the default suite's time)
def test_four_devices_resume_bitwise(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(CHILD), "multidevice", str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-6000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts == {"device_count": 4, "first_steps": 8, "resumed_from": 8, "steps": 16, "bitwise": True,
                     "history_equal": True, "state_devices": [4], "restored_on_template": True,
                     "restored_equal": True, "until": [10, "until", 10, 10, "until"], "until_bitwise": True}


def _meta(directory, steps) -> dict:
    return json.loads((Path(directory) / str(steps) / "meta" / "metadata").read_text())


@pytest.mark.slow
def test_a_run_until_ended_saves_its_end_and_resuming_it_runs_no_step(step, tmp_path):
    stopped = fit(tmp_path / "stopped", 24, step, until=until_ten)
    assert stopped.steps == 10 and stopped.retcode == "until" and stopped.history["loss"].shape == (10,)
    assert _steps(tmp_path / "stopped") == [4, 8, 10]
    assert _meta(tmp_path / "stopped", 10)["stopped"] == "until" and _meta(tmp_path / "stopped", 8)["stopped"] is None
    plain = fit(tmp_path / "plain", 10, step)
    _assert_bitwise(stopped.state, plain.state)
    np.testing.assert_array_equal(stopped.history["loss"], plain.history["loss"])

    before = _snapshot(tmp_path / "stopped")
    for kwargs in (dict(until=until_ten), {}):          # finished: also without until, and with more steps
        again = fit(tmp_path / "stopped", 30, step, **kwargs)
        assert again.resumed_from == 10 and again.steps == 10 and again.retcode == "until"
        _assert_bitwise(again.state, plain.state)
        np.testing.assert_array_equal(again.history["loss"], plain.history["loss"])
    assert _snapshot(tmp_path / "stopped") == before


def test_a_run_resumed_before_its_stop_stops_there_bitwise(step, tmp_path):
    whole = fit(tmp_path / "whole", 24, step, until=until_ten)
    first = fit(tmp_path / "split", 8, step, until=until_ten)
    assert first.retcode == "max_steps" and first.steps == 8
    resumed = fit(tmp_path / "split", 24, step, until=until_ten)
    assert resumed.resumed_from == 8 and resumed.steps == 10 and resumed.retcode == "until"
    _assert_bitwise(resumed.state, whole.state)
    np.testing.assert_array_equal(resumed.history["loss"], whole.history["loss"])


def test_minimize_resuming_a_converged_solve_runs_no_step(tmp_path):
    loss = lambda p: jnp.sum((p - 2.0) ** 2)
    run = lambda: loopfuse.minimize(loss, jnp.zeros(3), optimizer=optax.sgd(0.1), steps=40,
                                    backend=CompiledLoop(steps=8), until=lambda p, value: value < 1e-3,
                                    checkpoint_dir=tmp_path, checkpoint_every=8)
    solved = run()
    assert solved.retcode == "converged" and solved.steps % 8 != 0 and solved.loss_history.shape == (solved.steps,)
    assert _steps(tmp_path)[-1] == solved.steps and _meta(tmp_path, solved.steps)["stopped"] == "until"
    again = run()
    assert again.retcode == "converged" and again.steps == solved.steps
    _assert_bitwise(again.params, solved.params)
    np.testing.assert_array_equal(again.loss_history, solved.loss_history)


# ---- checkpoint_dir checked before anything runs ---------------------------------------------
def _fit_refused(step, directory, match, **kwargs):
    """fit on `directory` raises ValueError matching `match`, leaving the caller's state undonated."""
    fn, state, data = problem()
    with pytest.raises(ValueError, match=match):
        loopfuse.fit(step, state, data, 16, chunk=CHUNK, progress=False, checkpoint_dir=directory,
                     checkpoint_every=EVERY, **kwargs)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state))


def _minimize(directory, params):
    return loopfuse.minimize(lambda p: jnp.sum((p - 2.0) ** 2), params, optimizer=optax.sgd(0.1), steps=8,
                             checkpoint_dir=directory)


def test_an_empty_checkpoint_dir_is_refused_not_the_current_directory(step, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fit_refused(step, "", r"checkpoint_dir='' names no folder.*pass a folder, or None for no checkpoints")
    params = jnp.zeros(3)
    with pytest.raises(ValueError, match=r"checkpoint_dir='' names no folder"):
        _minimize("", params)
    assert not params.is_deleted() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("under", ["", "sub/dir"], ids=["the file", "under the file"])
def test_a_checkpoint_dir_that_is_or_is_under_a_file_is_refused_before_anything_runs(step, tmp_path, under):
    (tmp_path / "afile").write_text("mine")
    directory = tmp_path / "afile" / under if under else tmp_path / "afile"
    what = "exists" if not under else f"cannot be created: {tmp_path / 'afile'} exists"
    _fit_refused(step, directory, f"checkpoint_dir='{directory}' {what} and is not a folder; pass a folder")
    params = jnp.zeros(3)
    with pytest.raises(ValueError, match="and is not a folder"):
        _minimize(str(directory), params)
    assert not params.is_deleted()
    assert [p.name for p in tmp_path.iterdir()] == ["afile"] and (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("foreign, named", [
    ({"5/precious.txt": "mine"}, "5/"),                       # keep= would delete it
    ({"100/precious.txt": "mine"}, "100/"),                   # the latest: restoring it would fail
    ({"7": "a file"}, "7"),
    ({"100/": None}, "100/"),                                  # empty, but the latest: nothing to restore
    ({"0/": None, "3/meta.txt": "x", "30/precious.txt": "y"}, "3/, 30/"),    # 0/: as a kill leaves an old one
], ids=["older", "latest", "file", "empty latest", "several"])
def test_numbered_entries_that_are_not_checkpoints_are_refused_and_kept(step, tmp_path, foreign, named):
    fit(tmp_path, 8, step)                                    # 4/ and 8/, ours
    for name, text in foreign.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).mkdir() if text is None else (tmp_path / name).write_text(text)
    before = {str(p): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None) for p in tmp_path.rglob("*")}
    _fit_refused(step, tmp_path, rf"holds {named}: named like checkpoints, but not loopfuse checkpoints \(a 'meta' "
                                 r"item\).*nothing was touched", keep=1)
    assert {str(p): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
            for p in tmp_path.rglob("*")} == before


def test_what_a_kill_leaves_and_other_names_do_not_stop_a_resume(step, whole, tmp_path):
    fit(tmp_path, 8, step)
    (tmp_path / "12.orbax-checkpoint-tmp").mkdir()            # a save that a kill interrupted
    (tmp_path / "12.orbax-checkpoint-tmp" / "state").mkdir()
    shutil.copytree(tmp_path / "4", tmp_path / "0")           # an old one that orbax was deleting (keep=)
    shutil.rmtree(tmp_path / "0" / "meta")
    shutil.rmtree(tmp_path / "0" / "history")
    for name in ("007", "notes", "5x"):                       # not names orbax takes for steps
        (tmp_path / name).mkdir()
        (tmp_path / name / "mine.txt").write_text("mine")
    resumed = fit(tmp_path, 24, step)
    assert resumed.resumed_from == 8 and resumed.steps == 24
    _assert_bitwise(resumed.state, whole.state)
    assert not (tmp_path / "12.orbax-checkpoint-tmp").exists()                   # orbax cleaned them up
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name[0] != "0" and p.name.isdigit()) == [16, 20, 24]
    assert not (tmp_path / "0").exists()
    assert all((tmp_path / name / "mine.txt").read_text() == "mine" for name in ("007", "notes", "5x"))


def test_checkpoint_dir_expands_the_home_folder(step, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    first = fit("~/ck", 8, step)
    assert _steps(tmp_path / "home" / "ck") == [4, 8] and not (tmp_path / "~").exists()
    assert fit("~/ck", 8, step).resumed_from == 8 == first.steps
    _minimize("~/solve", jnp.zeros(3))
    assert _steps(tmp_path / "home" / "solve") == [8]
