"""Why roll-layers' backward loop writes a layer's new rows one iteration late: XLA:CPU's copies of stacked
leaves written in the iteration that reads them, with and without copy insertion's region analysis.

    python bench/xla_row_writes.py      # seconds

A minimal jax program, the shape of the backward loop's update: a `fori_loop` over L layers of three
stacked leaves (a parameter and Adam's two moments, [L, n] float32, donated) that reads layer l's rows,
computes their new values (the moments' update recomputed inside the parameter's, as XLA fuses it) and
writes them back at row l in the same iteration; the same, the rows written by a loop of their own inside
the iteration (one trip, a count XLA cannot fold: the form of XLA:CPU's loop that it keeps, `xla_cpu`, 5);
and the same loop writing each iteration's rows at the start of the next one (`pending`, carried), as
roll-layers does (`passes/xla_cpu.py`, 4). Temporaries are
XLA's compiled figures (exact). Region analysis (``xla_cpu_copy_insertion_use_region_analysis``) is what
lets XLA see that a row's write follows its last read; loopfuse turns it on only for programs without
control flow of their own besides wrap-loop's (`compile.xla.COPY_FREE`), so never for rolled loops.
"""
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

L, N = 8, 1 << 20
REGION = {"xla_cpu_copy_insertion_use_region_analysis": True}


def update(p, m, v, x):
    g = jnp.tanh(p * x)
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * g * g
    return p - 1e-3 * (m2 / 0.1) / (jnp.sqrt(v2 / 0.001) + 1e-8), m2, v2, jnp.sum(g)


def same_iteration(stacks, x):
    def body(l, c):
        (P, M, V), x = c
        p, m, v, s = update(P[l], M[l], V[l], x)
        return (P.at[l].set(p), M.at[l].set(m), V.at[l].set(v)), x + s
    return jax.lax.fori_loop(0, L, body, (stacks, x))


def own_loop(stacks, x):
    def body(l, c):
        (P, M, V), x = c
        p, m, v, s = update(P[l], M[l], V[l], x)
        trips = 1 + (s != s).astype(jnp.int32)        # 1 (2 where s is NaN): a count XLA cannot fold

        def write(w):
            k, (P, M, V) = w
            return k + 1, (P.at[l].set(p), M.at[l].set(m), V.at[l].set(v))
        _, stacks = jax.lax.while_loop(lambda w: w[0] < trips, write, (0, (P, M, V)))
        return stacks, x + s
    return jax.lax.fori_loop(0, L, body, (stacks, x))


def one_late(stacks, x):
    def body(l, c):
        (P, M, V), pending, x = c
        above = jnp.maximum(l - 1, 0)        # layer l - 1's rows (at l = 0: row 0 as it was)
        P, M, V = (S.at[above].set(r) for S, r in zip((P, M, V), pending))
        p, m, v, s = update(P[l], M[l], V[l], x)
        return (P, M, V), (p, m, v), x + s
    (P, M, V), pending, x = jax.lax.fori_loop(0, L, body, (stacks, tuple(S[0] for S in stacks), x))
    return tuple(S.at[L - 1].set(r) for S, r in zip((P, M, V), pending)), x


def main() -> None:
    ns = harness.parser(__doc__, rounds=1).parse_args()
    out = harness.Report("xla_row_writes", ns)
    z = jnp.zeros((L, N), jnp.float32)
    rows = []
    for name, fn in (("written in the iteration", same_iteration), ("written in the iteration by a loop of their own", own_loop),
                     ("written one iteration late", one_late)):
        for region in (False, True):
            lowered = jax.jit(fn, donate_argnums=0).lower((z, z, z), jnp.float32(1.0))
            temp = lowered.compile(compiler_options=REGION if region else {}).memory_analysis().temp_size_in_bytes
            rows.append(f"| {name} | {'on' if region else 'off'} | {temp / 2**20:.1f} |")
    stack = L * N * 4 / 2**20
    out.section(f"Three stacked leaves of {L} rows of {N * 4 / 2**20:.0f} MiB ({stack:.0f} MiB each), donated; "
                "temporaries of the compiled loop\n\n| rows | region analysis | temporaries MiB |\n|---|---|---:|\n"
                + "\n".join(rows) + "\n")
    out.write()


if __name__ == "__main__":
    main()
