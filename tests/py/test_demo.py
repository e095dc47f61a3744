"""`python -m loopfuse demo`: every figure it prints is one it computed, against like-for-like references."""
import re

import jax
import optax

import loopfuse
from loopfuse.__main__ import _loss, _problem, main


def _rows(out: str) -> dict[str, list[int]]:
    """The memory table: row label (name and what it returns) -> [arguments, outputs, aliased, temp, peak]."""
    rows = re.findall(r"^  (\S.*?\S)\s+((?:\d+\s+){4}\d+)$", out, re.M)
    return {label: [int(x) for x in numbers.split()] for label, numbers in rows}


def test_demo_compares_like_with_like(capsys, tmp_path):
    main(["demo", "--steps", "20", "--chunk", "10", "--dump-ir", str(tmp_path)])
    out = capsys.readouterr().out
    assert len(re.findall(r"^  step +(10|20)  loss \d+\.\d{5}$", out, re.M)) == 2

    rows = _rows(out)
    assert list(rows) == ["loopfuse.compile_step  state donated; returns state, loss",
                          "jax.jit                state donated; returns state, loss",
                          "jax.jit (as written)   no donation; returns state, loss, grads"], out
    for argument, output, alias, temp, peak in rows.values():
        assert peak == argument + output - alias + temp

    # the like-for-like reference, built here: jax.jit of the same update, state donated, loss only
    opt = optax.adam(3e-3)
    params, data = _problem()
    state, batch = (params, opt.init(params)), {k: v[:128] for k, v in data.items()}

    def loss_only_step(state, batch):
        params, opt_state = state
        loss, grads = jax.value_and_grad(_loss)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": loss}

    ref = loopfuse.MemoryStats.from_analysis(
        jax.jit(loss_only_step, donate_argnums=0).lower(state, batch).compile().memory_analysis())
    ours, same, written = rows.values()
    assert same == [ref.argument, ref.output, ref.alias, ref.temp, ref.peak]
    assert ours[2] == same[2] > 0 and written[2] == 0           # both donate the state; as written does not
    assert ours[1] == same[1] < written[1]                      # no gradients among the outputs

    ratios = dict(re.findall(r"peak ratio loopfuse / jax.jit \((.+?)\) += (\d\.\d{3})$", out, re.M))
    assert ratios == {"same donation and outputs": f"{ours[4] / same[4]:.3f}",
                      "as written": f"{ours[4] / written[4]:.3f}"}
    assert f"IR after tracing and after every pass: {tmp_path}/" in out and any(tmp_path.glob("*/00-traced.mlir"))
