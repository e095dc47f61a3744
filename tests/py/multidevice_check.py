"""Multi-device checks for test_multidevice.py, run in a fresh process with 4 CPU devices.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu python tests/py/multidevice_check.py

jax fixes its device count when it is first imported, so these checks cannot share the pytest
process (other test modules have already imported jax with one device). Prints one JSON object
of facts (differences to single-device runs, output shardings, IR annotations, errors) that the
test asserts on; nothing here asserts, so one failing fact does not hide the others.
"""
import json
import os
import sys
import traceback

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
from jaxlib.mlir import ir  # noqa: E402

import loopfuse  # noqa: E402
from loopfuse import Dataset, compile_step  # noqa: E402
from loopfuse.compile.mlir_context import parse_module  # noqa: E402
from loopfuse.passes.functions import arg_attrs, main_func, result_attrs  # noqa: E402
from loopfuse.passes.vocabulary import SDY_SHARDING  # noqa: E402
from problems import NegateFirstResult  # noqa: E402

K = 4
OPT = optax.adam(1e-2)
# Well conditioned for the wide model: plain adam moves every weight by +-lr whatever its gradient's
# size, so a gradient within rounding of 0 (whose sign the cross-device sum order decides) would make
# single- and multi-device runs differ by 2 lr; an eps near the gradients' scale makes that continuous.
WIDE_OPT = optax.adam(1e-4, eps=1e-4)


# ---- models ------------------------------------------------------------------------------------
def mlp_state(seed=0):
    k = jax.random.split(jax.random.key(seed), 2)
    params = {"w1": jax.random.normal(k[0], (4, 16)) * 0.5, "b1": jnp.zeros(16),
              "w2": jax.random.normal(k[1], (16, 2)) * 0.3}
    return {"params": params, "opt": OPT.init(params)}


def tanh_mlp_step(opt, w: str, b: str, v: str):
    """An optax step on mean((tanh(x @ p[w] + p[b]) @ p[v] - y) ** 2) over state {"params", "opt"}."""
    def step(state, batch):
        def loss_fn(p):
            h = jnp.tanh(batch["x"] @ p[w] + p[b])
            return jnp.mean((h @ p[v] - batch["y"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = opt.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt_state}, {"loss": loss}
    return step


mlp_step = tanh_mlp_step(OPT, "w1", "b1", "w2")


def wide_state(seed=0):
    """A (256, 1024) f32 weight is exactly 1 MiB with a leading axis divisible by 4: "params" splits it."""
    k = jax.random.split(jax.random.key(seed), 2)
    params = {"w": jax.random.normal(k[0], (256, 1024)) * 0.02, "b": jnp.zeros(1024),
              "v": jax.random.normal(k[1], (1024,)) * 0.05}
    return {"params": params, "opt": WIDE_OPT.init(params)}


wide_step = tanh_mlp_step(WIDE_OPT, "w", "b", "v")


def mlp_batch(n=16):
    x = jax.random.normal(jax.random.key(1), (n, 4))
    return {"x": np.asarray(x), "y": np.asarray(jnp.sin(x[:, :2]))}


def wide_batch(n=16):
    x = jax.random.normal(jax.random.key(3), (n, 256))
    return {"x": np.asarray(x), "y": np.asarray(jnp.sin(x[:, 0]))}


# ---- helpers -----------------------------------------------------------------------------------
def host(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


def run_single_calls(step, state, batch, k, **kw):
    losses = []
    for i in range(k):
        state, aux = step(state, batch, **({"start": i} if isinstance(batch, Dataset) else {}), **kw)
        losses.append(float(aux["loss"]))
    return state, np.array(losses)


def max_rel_diff(a_tree, b_tree) -> float:
    """max over leaves of max|a - b| / max|b|: the difference relative to each leaf's scale.

    (Per element relative differences are meaningless for entries that are near 0 in both runs.)
    """
    worst = 0.0
    a_leaves, b_leaves = jax.tree_util.tree_leaves(a_tree), jax.tree_util.tree_leaves(b_tree)
    if len(a_leaves) != len(b_leaves):
        return float("inf")
    for a, b in zip(a_leaves, b_leaves):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            return float("inf")
        if a.size:
            worst = max(worst, float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-6)))
    return worst


def placement_facts(tree) -> dict:
    """Per leaf path: is it a jax.Array, how many devices hold it, its PartitionSpec."""
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        sh = getattr(x, "sharding", None)
        out[jax.tree_util.keystr(path)] = {
            "is_jax_array": isinstance(x, jax.Array),
            "num_devices": len(sh.device_set) if sh is not None else 0,
            "spec": str(sh.spec) if hasattr(sh, "spec") else None,
            "shape": list(np.shape(x)),
            "fully_addressable_shards": len(x.addressable_shards) if isinstance(x, jax.Array) else 0,
            "shard_shape": list(x.addressable_shards[0].data.shape) if isinstance(x, jax.Array) else None,
        }
    return out


def signature(text: str) -> dict:
    """The final module's @main signature: per argument / result its state path and sdy.sharding."""
    module = parse_module(text)
    with module.context:
        f = main_func(module.operation)

        def describe(attrs, types):
            return [{"state": ir.StringAttr(a["loopfuse.state"]).value if "loopfuse.state" in a else None,
                     "step_index": "loopfuse.step_index" in a,
                     "sharding": str(a[SDY_SHARDING]) if SDY_SHARDING in a else None,
                     "type": str(t)} for a, t in zip(attrs, types)]

        return {"args": describe(arg_attrs(f), f.type.inputs),
                "results": describe(result_attrs(f), f.type.results),
                "has_mesh": "sdy.mesh" in text,
                "mesh_lines": [ln.strip() for ln in text.splitlines() if ln.strip().startswith("sdy.mesh")],
                "while_count": text.count("stablehlo.while"),
                "text": text}


def guarded(fn):
    try:
        return fn()
    except Exception as e:  # reported, asserted on by the test
        return {"exception": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}


# ---- checks ------------------------------------------------------------------------------------
def check_data() -> dict:
    devices = jax.devices()
    batch = mlp_batch()
    ref_state, ref_losses = run_single_calls(compile_step(mlp_step), mlp_state(), batch, K)
    ref_state = host(ref_state)

    step = compile_step(mlp_step, devices=devices, sharding="data")
    st, losses = run_single_calls(step, mlp_state(), batch, K)
    loop = step.loop(K)
    loop_state, loop_aux = loop(mlp_state(), batch)
    # A second loop call continues from the returned (sharded, donated-into) state.
    loop_state_host = host(loop_state)
    loop_state2, _ = loop(loop_state, batch)
    ref_state2, _ = run_single_calls(compile_step(mlp_step), jax.tree_util.tree_map(jnp.asarray, ref_state),
                                     batch, K)
    final = loop.lower(mlp_state(), batch)["final"]
    return {
        "num_devices": len(devices),
        "ref_losses": ref_losses.tolist(),
        "step_losses": losses.tolist(),
        "loop_losses": np.asarray(loop_aux["loss"]).tolist(),
        "step_state_rel_diff": max_rel_diff(st, ref_state),
        "loop_state_rel_diff": max_rel_diff(loop_state_host, ref_state),
        "loop2_state_rel_diff": max_rel_diff(loop_state2, ref_state2),
        "step_placement": placement_facts(st),
        "loop_placement": placement_facts({"state": loop_state2, "aux": loop_aux}),
        "step_compile_count": step.compile_count,
        "loop_compile_count": loop.compile_count,   # lower() does not compile
        "signature": signature(final),
    }


def check_params() -> dict:
    devices = jax.devices()
    batch = wide_batch()
    ref_loop = compile_step(wide_step).loop(K)
    ref_state, ref_aux = ref_loop(wide_state(), batch)
    loop = compile_step(wide_step, devices=devices, sharding="params").loop(K)
    st, aux = loop(wide_state(), batch)
    final = loop.lower(wide_state(), batch)["final"]
    return {
        "ref_losses": np.asarray(ref_aux["loss"]).tolist(),
        "loop_losses": np.asarray(aux["loss"]).tolist(),
        "state_rel_diff": max_rel_diff(st, ref_state),
        "placement": placement_facts({"state": st, "aux": aux}),
        "signature": signature(final),
    }


def check_bad_batch() -> dict:
    """x splits over 4 devices, w (6 rows) does not: the error names ['w']; a bare array of 6 rows as the
    batch: the error names the batch."""
    step = compile_step(lambda s, b: (s, {"loss": jnp.sum(b["x"]) + jnp.sum(b["w"])}),
                        devices=jax.devices(), sharding="data")
    state = {"p": jnp.ones(3)}
    batch = {"x": np.ones((8, 4), np.float32), "w": np.ones((6,), np.float32)}
    try:
        step(state, batch)
    except Exception as e:
        facts = {"exception": type(e).__name__, "message": str(e),
                 "is_state_mismatch": isinstance(e, loopfuse.StateMismatchError),
                 "compile_count": step.compile_count}
    else:
        return {"exception": None}
    bare = compile_step(lambda s, b: (s, {"loss": jnp.sum(b)}), devices=jax.devices(), sharding="data")
    try:
        bare(state, np.ones((6, 3), np.float32))
    except loopfuse.StateMismatchError as e:
        facts["bare_message"] = str(e)
    return facts


def check_dataset() -> dict:
    n, bs, k = 40, 8, 7  # 5 batches per epoch: the loop wraps into the second epoch
    x = jax.random.normal(jax.random.key(5), (n, 4))
    arrays = {"x": x, "y": jnp.sin(x[:, :2])}
    result = {}
    for name, key in (("no_key", None), ("key", jax.random.key(0))):
        ds = Dataset(arrays, batch_size=bs, key=key)
        ref_state, ref_aux = compile_step(mlp_step).loop(k)(mlp_state(), ds)
        loop = compile_step(mlp_step, devices=jax.devices()).loop(k)
        st, aux = loop(mlp_state(), ds)
        result[name] = {
            "ref_losses": np.asarray(ref_aux["loss"]).tolist(),
            "loop_losses": np.asarray(aux["loss"]).tolist(),
            "state_rel_diff": max_rel_diff(st, ref_state),
            "placement": placement_facts(st),
        }
    return result


def check_scalar_and_dataset_batch_size() -> dict:
    """A scalar batch leaf (a hyperparameter) is replicated; a Dataset batch of 6 on 4 devices is refused."""
    step = compile_step(lambda s, b: (s - b["lr"] * jnp.mean(b["x"]), jnp.sum(b["x"])), donate=False,
                        devices=jax.devices(), sharding="data")
    out, _ = step(jnp.ones(3), {"x": np.ones((8, 2), np.float32), "lr": np.float32(0.5)})
    ds = Dataset({"x": np.ones((24, 2), np.float32)}, batch_size=6)
    try:
        step(jnp.ones(3), ds)
        message = None
    except loopfuse.StateMismatchError as e:
        message = str(e)
    return {"scalar_out": np.asarray(out).tolist(), "dataset_error": message}


def check_minimize() -> dict:
    """minimize with CompiledLoop(devices=..., sharding="data") reaches the single-device params."""
    rng = np.random.default_rng(3)
    a = rng.normal(size=(32, 5)).astype(np.float32)
    data = {"a": a, "y": a @ rng.normal(size=(5,)).astype(np.float32)}
    loss = lambda w, b: jnp.mean((b["a"] @ w - b["y"]) ** 2)
    w0 = jnp.zeros(5)
    one = loopfuse.minimize(loss, w0, data, optax.adam(0.05), steps=30, backend=loopfuse.CompiledLoop(steps=10))
    four = loopfuse.minimize(loss, w0, data, optax.adam(0.05), steps=30,
                             backend=loopfuse.CompiledLoop(steps=10, devices=jax.devices(), sharding="data"))
    return {"rel_diff": max_rel_diff(four.params, one.params),
            "history_diff": float(np.max(np.abs(four.loss_history - one.loss_history))),
            "num_devices": len(four.params.sharding.device_set)}


def check_micro_batch() -> dict:
    """micro_batches=2 over 4 devices: a fixed batch and a shuffled Dataset's against the whole batch on
    one device; the report; the temporaries per device of the wide model without and with 4 slices."""
    devices, batch = jax.devices(), mlp_batch(32)
    ref_state, ref_aux = compile_step(mlp_step).loop(K)(mlp_state(), batch)
    loop = compile_step(mlp_step, devices=devices, micro_batches=2).loop(K)
    st, aux = loop(mlp_state(), batch)
    ds = Dataset(mlp_batch(64), batch_size=32, key=jax.random.key(0))
    ds_ref_state, ds_ref_aux = compile_step(mlp_step).loop(K)(mlp_state(), ds)
    ds_loop = compile_step(mlp_step, devices=devices, micro_batches=2).loop(K)
    ds_state, ds_aux = ds_loop(mlp_state(), ds)
    temp = {str(m): compile_step(wide_step, devices=devices, micro_batches=m).memory_stats(wide_state(), wide_batch(4096)).temp
            for m in (None, 4)}
    return {
        "ref_losses": np.asarray(ref_aux["loss"]).tolist(),
        "loop_losses": np.asarray(aux["loss"]).tolist(),
        "state_rel_diff": max_rel_diff(st, ref_state),
        "placement": placement_facts(st),
        "report": loop.compiled(mlp_state(), batch).reports["micro-batch"],
        "final": loop.lower(mlp_state(), batch)["final"],
        "dataset_losses": np.asarray(ds_aux["loss"]).tolist(),
        "dataset_ref_losses": np.asarray(ds_ref_aux["loss"]).tolist(),
        "dataset_state_rel_diff": max_rel_diff(ds_state, ds_ref_state),
        "dataset_report": ds_loop.compiled(mlp_state(), ds).reports["micro-batch"],
        "temp": temp,
    }


def check_verify() -> dict:
    """verify=True on 4 devices (sharding="data"), an Adam MLP: per call (a step, loop(K) on a fixed batch,
    loop(K) on a shuffled Dataset from step 3) the MiscompileError it raised, or whether its new state equals
    jax.jit with the same shardings bitwise (the step; K such calls for the loop) or how far it is from one
    device's loop (the Dataset's); whether one device's jax.jit step equals the sharded one too; and the
    culprits verify names for a wrong pass on the mesh."""
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharded = jax.jit(mlp_step, in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))),
                      out_shardings=NamedSharding(mesh, P()))
    batch, ds = mlp_batch(), Dataset(mlp_batch(64), batch_size=16, key=jax.random.key(0))
    references = [mlp_state()]
    for _ in range(K):
        references.append(sharded(references[-1], batch)[0])
    ds_reference = compile_step(mlp_step).loop(K)(mlp_state(), ds, start=3)[0]
    step = compile_step(mlp_step, devices=jax.devices(), verify=True)

    def same_bits(a, b) -> bool:
        return all(np.asarray(x).tobytes() == np.asarray(y).tobytes()
                   for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))

    def run(call):
        try:
            return call()
        except loopfuse.MiscompileError as e:
            return {"miscompile": str(e)}
    out = {
        "step": run(lambda: {"equal": same_bits(step(mlp_state(), batch)[0], references[1])}),
        "loop": run(lambda: {"equal": same_bits(step.loop(K)(mlp_state(), batch)[0], references[K])}),
        "dataset": run(lambda: {"rel_diff": max_rel_diff(step.loop(K)(mlp_state(), ds, start=3)[0], ds_reference)}),
        "one_device_equal": same_bits(jax.jit(mlp_step)(mlp_state(), batch)[0], references[1]),
    }
    wrong = compile_step(mlp_step, devices=jax.devices(), verify=True, passes=[NegateFirstResult()])
    try:
        wrong(mlp_state(), batch)
        out["wrong_pass"] = None
    except loopfuse.MiscompileError as e:
        out["wrong_pass"] = {"path": e.path, "culprits": e.culprits}
    return out


def check_roll() -> dict:
    """memory_budget=0.0 on a residual RMS-norm MLP of 4 blocks of 32, batch 128, on 1 and on 4 devices: the
    temporaries of the unrolled step, of the state as a pytree (stacked inside the call where the pass rolls it)
    and packed, and what roll-layers reported for the pytree."""
    import layered
    from problems import fresh
    step, state, batch = layered.rms_mlp(4, 32, 128)
    out = {}
    for n in (1, 4):
        kw = {"devices": jax.devices()[:n], "sharding": "data"} if n > 1 else {}
        rolled = compile_step(step, memory_budget=0.0, **kw)
        out[n] = {"unrolled": compile_step(step, **kw).memory_stats(fresh(state), batch).temp,
                  "pytree": rolled.memory_stats(fresh(state), batch).temp,
                  "packed": rolled.memory_stats(loopfuse.pack(fresh(state), layers=True), batch).temp,
                  "report": rolled.compiled(fresh(state), batch).reports["roll-layers"]}
    return out


def check_set_mesh() -> dict:
    """A data-parallel step called inside ``jax.set_mesh``: under Explicit axes a ValueError saying why (it was
    jax's mismatched-mesh error from inside the trace), under Auto axes jax.jit's loss."""
    from jax.sharding import AxisType

    def step(s, b):
        value, g = jax.value_and_grad(lambda w: jnp.sum((b @ w) ** 2))(s["w"])
        return {"w": s["w"] - 0.01 * g}, {"loss": value}
    out = {}
    for kind in (AxisType.Explicit, AxisType.Auto):
        with jax.set_mesh(jax.make_mesh((4,), ("d",), axis_types=(kind,))):
            state, x = {"w": jnp.ones((8, 4))}, jnp.ones((16, 8))
            expected = jax.jit(step)(state, x)[1]["loss"]
            try:
                got = compile_step(step, devices=jax.devices())(state, x)[1]["loss"]
                out[str(kind)] = {"equal": bool(np.array_equal(got, expected))}
            except ValueError as e:
                out[str(kind)] = {"message": str(e), "state_kept": not state["w"].is_deleted()}
    return out


def check_constraint() -> dict:
    """A step that lays a value out over the 4 devices (``with_sharding_constraint``, ``shard_map``), which
    jax.jit runs over them: without ``devices=`` a ValueError saying so (it ran on one device, silently other
    last bits than jax.jit's), with them jax.jit's state."""
    mesh = Mesh(np.array(jax.devices()), ("data",))
    opt = optax.adam(1e-2)

    def step(layout):
        def fn(s, b):
            def loss(p):
                h = layout(jnp.tanh(b["x"] @ p["w1"]))
                return jnp.mean((h @ p["w2"] - b["y"]) ** 2)
            value, g = jax.value_and_grad(loss)(s[0])
            u, o = opt.update(g, s[1], s[0])
            return (optax.apply_updates(s[0], u), o), {"loss": value}
        return fn

    layouts = {"constraint": lambda h: jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P("data"))),
               "shard_map": jax.shard_map(lambda h: 2 * h, mesh=mesh, in_specs=P("data"), out_specs=P("data"))}
    params = {"w1": jnp.linspace(-1, 1, 48).reshape(6, 8), "w2": jnp.linspace(-1, 1, 16).reshape(8, 2)}
    batch = {"x": jnp.linspace(-2, 2, 96).reshape(16, 6), "y": jnp.linspace(0, 1, 32).reshape(16, 2)}


    def fresh():
        return jax.tree.map(jnp.array, params), opt.init(params)
    out = {}
    for name, layout in layouts.items():
        state = fresh()
        try:
            compile_step(step(layout))(state, batch)
            out[name] = {"ran": True}
        except ValueError as e:
            out[name] = {"message": str(e), "state_kept": not any(x.is_deleted() for x in jax.tree.leaves(state))}
        expected = jax.jit(step(layout))(fresh(), batch)
        got = compile_step(step(layout), devices=jax.devices())(fresh(), batch)
        out[name]["equal_with_devices"] = all(np.array_equal(a, b) for a, b in zip(host(jax.tree.leaves(got)),
                                                                                   host(jax.tree.leaves(expected))))
    return out


CHECKS = {"data": check_data, "params": check_params, "bad_batch": check_bad_batch, "dataset": check_dataset,
          "scalars": check_scalar_and_dataset_batch_size, "minimize": check_minimize, "micro_batch": check_micro_batch,
          "verify": check_verify, "roll": check_roll, "set_mesh": check_set_mesh,
          "constraint": check_constraint}


def main(names) -> None:
    facts = {"device_count": jax.device_count()}
    for name in names or CHECKS:
        facts[name] = guarded(CHECKS[name])
    json.dump(facts, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
