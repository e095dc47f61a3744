"""bench/harness.py: the statistic every benchmark reports, its rounds, the reference compiled
with loopfuse's XLA options, and the pasting of figures into BENCHMARKS.md."""
import sys
from functools import partial
from pathlib import Path

import jax
import pytest

import loopfuse

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import harness  # noqa: E402


def test_compare_ratio_of_medians_and_direction():
    fast, slow = [1.0, 1.1, 0.9], [2.0, 2.2, 1.8]  # seconds
    c = harness.compare(fast, slow, higher_is_better=False)
    assert c["ratio"] == pytest.approx(2.0) and c["measured"]
    assert harness.ratio_text(c) == "2.00x"
    rates = harness.compare([10.0, 12.0, 8.0], [5.0, 6.0, 4.0], higher_is_better=True)
    assert rates["ratio"] == pytest.approx(2.0) and rates["measured"]


def test_overlapping_spreads_are_no_measured_difference():
    # Medians 1.0 vs 1.05: the ranges overlap, so no ratio is claimed; the spread is the larger half-range.
    c = harness.compare([0.9, 1.0, 1.1], [1.0, 1.05, 1.3], higher_is_better=False)
    assert not c["measured"]
    assert c["spread"] == pytest.approx(0.15 / 1.05)
    assert harness.ratio_text(c) == "no difference measured (±14%)"


def test_interleave_alternates_the_order():
    calls = []
    out = harness.interleave({"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2}, rounds=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert out == {"a": [1, 1, 1], "b": [2, 2, 2]}


def test_paste_replaces_figure_blocks_only():
    md = ("# B\n<!-- figure: loop -->\nold\n<!-- /figure -->\ntext\n"
          "<!-- figure: memory -->\nkept\n<!-- /figure -->\n")
    out = harness.paste(md, {"loop": "new 1\nnew 2\n", "other": "unused"})
    assert out == ("# B\n<!-- figure: loop -->\nnew 1\nnew 2\n<!-- /figure -->\ntext\n"
                   "<!-- figure: memory -->\nkept\n<!-- /figure -->\n")


def test_reference_gets_loopfuse_options():
    """The fori_loop reference compiled with loopfuse's XLA options needs what loopfuse's loop needs,
    and less than as users write it (copy insertion with region analysis)."""
    import bench_loop
    layers = (256,) * 4
    state, batch = bench_loop.init_state(layers), bench_loop.make_batch(layers, 16)
    loop = loopfuse.compile_step(bench_loop.train_step, keep_aux=("loss",)).loop(3)
    options = harness.loopfuse_options(loop, state, batch)
    assert options == {loopfuse.runtime.COPY_FREE[jax.devices()[0].platform]: True}
    fori = partial(bench_loop.fori_train, steps=3)
    same = harness.jit_memory(harness.jit(fori, options), state, batch)
    plain = harness.jit_memory(harness.jit(fori), state, batch)
    assert same.temp == loop.memory_stats(state, batch).temp < plain.temp


def test_report_writes_environment_markdown_and_json(tmp_path):
    args = harness.parser(__doc__, rounds=3).parse_args(["--out", str(tmp_path), "--json", str(tmp_path / "r.json")])
    report = harness.Report("demo", args, command="python bench/demo.py")
    report.section("| a |\n|---|\n| 1 |", demo=[1])
    text = report.write()
    assert text.startswith("`python bench/demo.py`: ") and "jax " + jax.__version__ in text and "| 1 |" in text
    assert f"dispatch {loopfuse._jax_compat.status()['dispatch']}" in text
    assert (tmp_path / "demo.md").read_text() == text
    assert '"demo": [\n    1\n  ]' in (tmp_path / "r.json").read_text()
