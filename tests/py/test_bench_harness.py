"""bench/harness.py: the statistic every benchmark reports, its rounds, the reference compiled
with loopfuse's XLA options, and the pasting of figures into BENCHMARKS.md."""
import statistics
import sys
from functools import partial
from pathlib import Path

import jax
import pytest

import loopfuse
from problems import SMALL_LOOP_KERNELS

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


@pytest.mark.slow      # (a bench script's harness, compiled: 3 s)
def test_reference_gets_loopfuse_options():
    """The fori_loop reference compiled with loopfuse's XLA options needs what loopfuse's loop needs,
    and less than as users write it (copy insertion with region analysis)."""
    import bench_loop
    layers = (256,) * 4
    state, batch = bench_loop.init_state(layers), bench_loop.make_batch(layers, 16)
    loop = loopfuse.compile_step(bench_loop.train_step, keep_aux=("loss",)).loop(3)
    options = harness.loopfuse_options(loop, state, batch)
    assert options == {loopfuse.compile.xla.COPY_FREE[jax.devices()[0].platform]: True}
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


def test_paired_ratio_is_the_median_of_per_round_ratios():
    # Round by round 0.5, 0.6, 2.0 (a slow outlier round on the first side): median 0.6, not 1.1 / 1.5.
    c = harness.paired_ratio([1.0, 3.0, 2.0], [2.0, 5.0, 1.0])
    assert c == {"ratio": pytest.approx(0.6), "min": pytest.approx(0.5), "max": pytest.approx(2.0)}
    assert harness.paired_text(c) == "0.60x (0.50–2.00)" and harness.paired_text(c, True) == "1.00x (reference)"


def test_compile_rounds_interleave_time_whole_and_keep_the_last_build():
    calls = []

    def build(name, part):
        def run():
            calls.append(name)
            return f"{name}{len(calls)}", {"xla": part}
        return run
    timed = harness.compile_rounds({"a": build("a", 0.0), "b": build("b", 0.0)}, rounds=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert timed["a"]["built"] == "a5" and timed["b"]["built"] == "b6"
    assert all(len(t["total"]) == 3 and all(p["other"] == pytest.approx(s) for p, s in zip(t["parts"], t["total"]))
               for t in timed.values())   # no part measured: all of the wall time is "other"
    stats = harness.compile_stats({"total": [2.0, 4.0, 3.0], "parts": [{"xla": 1.0, "wrap-loop": 0.5}] * 3},
                                  {"total": [4.0, 4.0, 4.0]})
    assert stats["seconds"]["median"] == 3.0 and stats["vs_reference"]["ratio"] == pytest.approx(0.75)
    assert harness.parts_cells(stats) == "| 3.00 | — | — | 0.50 | 1.00 | — | wrap-loop 0.50 |"


def test_state_match_unpacks_and_measures_the_difference():
    a = {"w": jax.numpy.ones((2, 3)), "b": jax.numpy.zeros(3)}
    packed = loopfuse.pack(a)
    assert harness.state_match(packed, a) == {"bitwise_vs_scan": True, "max_abs_diff_vs_scan": 0.0,
                                              "max_rel_diff_vs_scan": 0.0}
    off = {"w": a["w"].at[0, 0].set(1.5), "b": a["b"]}
    m = harness.state_match(off, a)
    assert not m["bitwise_vs_scan"] and m["max_abs_diff_vs_scan"] == 0.5 and m["max_rel_diff_vs_scan"] == 0.5
    assert harness.match_text(m) == "False (max diff 5.0e-01, relative 5.0e-01)"
    assert harness.state_match({"w": a["w"], "b": a["b"].at[1].set(1.0)}, a)["max_rel_diff_vs_scan"] == float("inf")


@pytest.mark.slow      # (a bench script's run, compiled in rounds: 4 s)
def test_bench_pack_times_compiles_in_rounds_with_their_parts(monkeypatch):
    """bench_pack.run at 4 leaves, the scan and the packed-between-calls loop: each compiled in two
    rounds, the parts of each compile recorded, the packed loop's state bitwise the scan's."""
    import bench_pack
    from loopfuse.compile import cache
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)   # restored after the test (run unsets it)
    jax_cache = jax.config.jax_enable_compilation_cache
    try:
        res = bench_pack.run(4, [2], rounds=1, calls=1, only={5}, compile_rounds=2)
    finally:
        jax.config.update("jax_enable_compilation_cache", jax_cache)
    scan, packed = (by_k[2] for by_k in res["rows"].values())
    assert list(res["rows"]) == ["lax.scan (jax.jit, donated)",
                                 "loopfuse loop, state packed between calls (loopfuse.pack)"]
    assert scan["compile"]["vs_reference"] == {"ratio": 1.0, "min": 1.0, "max": 1.0}
    assert set(scan["compile"]["parts"]) == {"trace", "xla", "other"}
    assert {"pack", "trace", "xla", "other"} < set(packed["compile"]["parts"])   # and the passes
    assert [len(r["compile"]["seconds"]["rounds"]) for r in (scan, packed)] == [2, 2]
    assert packed["compile_s"] == statistics.median(packed["compile"]["seconds"]["rounds"])
    # jaxlib 0.12.1 runs a loop this small as one kernel, its packed program's and the scan's each rounding its own way
    assert (packed["bitwise_vs_scan"] or SMALL_LOOP_KERNELS) and packed["steps_per_s"] > 0


def test_hlo_ops_counts_the_instructions_in_and_outside_the_loop():
    """A loop's work is in its while body, a step's outside any; an instruction with a tuple shape (the while
    itself) is counted, parameters and tuples are not; a loopfuse Step's executable and jax.jit's alike."""
    import jax.numpy as jnp

    def fn(s, b):
        return s * b + 1.0, jnp.sum(s)
    s, b = jnp.ones(3), jnp.ones(3)
    loop = harness.hlo_ops(harness.optimized_hlo(loopfuse.compile_step(fn).loop(100), s, b))
    step = harness.hlo_ops(harness.optimized_hlo(jax.jit(fn), s, b))
    assert loop["outside"]["while"] == 1 and loop["loop body"] and not step["loop body"]
    assert not {"parameter", "tuple", "get-tuple-element", "call"} & (set(loop["loop body"]) | set(step["outside"]))
    assert sum(step["outside"].values()) > 0
    assert harness.ops_text({"copy": 1, "fusion": 3}) == "fusion 3, copy 1" and harness.ops_text({}) == "—"
