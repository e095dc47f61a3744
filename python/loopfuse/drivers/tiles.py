"""An ensemble's default tile, from a cost model of its member step read off the step's program.

A tile of T members costs about ``a + T * w``: `a` its fixed cost (each of its kernels' launch and
loop overhead, the step's and the tile's own gather and scatter), `w` one member's work. The model
picks ``r = a / w``, the tile whose work equals its fixed cost:

* Without loops of the member's own, tiles of r members cost at most twice the work while they are
  full (``a / r + w = 2 w``), and a member left running alone in a tile at most twice a tile of one
  (``a + r w = 2 a``): a larger tile saves less than its overhead when members stop apart, a smaller
  one less than its work when they stop together.
* A loop whose trip count depends on the member (a ``while`` whose predicate reads, through its
  carry, the member's state or own data: a line search, an adaptive ODE solver) runs, vmapped, until
  the tile's slowest member is done. The tile's work is then at most the sum of its members' (the
  slowest member's, T times), so tiles of r members cost no more than tiles of one
  (``a / r + r w = a + w``), and about ``2 w`` when the trip counts are alike.
* Nested such loops break that bound: for every trip of the outer loop the inner one runs to the
  slowest member's end, the members already done re-running their last inner loop, so the tile's
  work grows with the product of its members' worst trip counts, not their sum. The model takes it
  as up to `NESTED` times the members' own work: the tile is ``r / NESTED``, one member on a CPU
  (where r is at most a few hundred).

``r = ELEMENTS_PER_OP[platform] * ops / elements``, read from one member's step as jax traces it
(each loop and branch body once: trip counts are the data's): `ops`, its operations plus the tile's
own (`TILE_OPS`, a gather and a scatter per state leaf, a gather per per-member data leaf, a row
written per aux leaf); `elements`, the largest operand or result of each, one member's, summed;
`ELEMENTS_PER_OP`, the elements of work a kernel's fixed cost is worth on the platform. The tile is
the power of two nearest r (``r / NESTED``), at least 1 and at most N. Everything is read from the
program (its jaxpr, the member count, the devices' platform), nothing timed, so a call's tile, and
with it its results, are the same from run to run.

Where it stops: operations are jaxpr equations, not the kernels XLA fuses them into; a vmapped loop
with a member-dependent predicate also selects its whole carry every trip (the Lotka-Volterra step
vmapped over two alike members costs 3x one member's); trip counts are unknown. The CPU's constant
is fitted to the ensemble bench (bench/bench_ensemble.py, BENCHMARKS.md: tiles of 32 quadratics of 64
parameters, one member of the Lotka-Volterra fit; it is also what a kernel's fixed cost measures
against its elements there); the accelerators' is an estimate (a ~5 us launch against ~3 TB/s), not
measured.
"""
from dataclasses import dataclass
from typing import Callable

import jax
import numpy as np
from jax.extend.core import Literal, jaxprs_in_params

ELEMENTS_PER_OP = {"cpu": 1024}   # a kernel's fixed cost, in elements of work; other platforms: `ACCELERATOR`
ACCELERATOR = 1 << 20
NESTED = 1 << 10                  # the work of nested member-dependent loops, times the members' own
TILE_OPS = 8                      # a tile's own operations beside its leaves' (its slice of the order, the mask)


@dataclass(frozen=True)
class Cost:
    """What the model reads from one member's step: its `ops` with the tile's own, their `elements`
    (one member's), the `nesting` depth of loops whose trip count depends on the member (0: none).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> def halve(x, tol):      # a loop whose trip count depends on the member's x
        ...     return jax.lax.while_loop(lambda y: jnp.abs(y).max() > tol, lambda y: y / 2, x), {}
        >>> def shared(x, k):       # a loop whose trip count is the shared batch's
        ...     return jax.lax.fori_loop(0, k, lambda i, y: y / 2, x), {}
        >>> def nested(x, tol):
        ...     return jax.lax.while_loop(lambda y: jnp.abs(y).max() > tol, lambda y: halve(y / 2, tol)[0], x), {}
        >>> one = jax.ShapeDtypeStruct((64,), jnp.float32)
        >>> [cost(step, one, 3, own=False).nesting for step in (halve, shared, nested)]
        [1, 0, 2]
        >>> cost(halve, one, 3, own=False)
        Cost(ops=15, elements=330, nesting=1)
    """

    ops: int
    elements: int
    nesting: int

    def ratio(self, platform: str) -> float:
        """``a / w`` on `platform`: the members whose work equals a tile's fixed cost."""
        return ELEMENTS_PER_OP.get(platform, ACCELERATOR) * self.ops / max(self.elements, 1)

    def tile(self, n: int, platform: str) -> int:
        """The tile of `n` members on `platform` (see the module docstring)."""
        best = self.ratio(platform) / (NESTED if self.nesting > 1 else 1)
        return min(n, 1 << max(round(np.log2(best)), 0))


def cost(member: Callable, state, batch, own: bool) -> Cost:
    """The `Cost` of ``member(state, batch) -> (state, aux)`` on one member's `state` and `batch`
    (arrays or abstract values); `own`: the batch is the member's own (per-member data), else shared."""
    closed = jax.make_jaxpr(member)(state, batch)
    n_state, n_batch = len(jax.tree_util.tree_leaves(state)), len(jax.tree_util.tree_leaves(batch))
    walk = _Walk()
    walk.run(closed.jaxpr, (True,) * n_state + (own,) * n_batch, 0)
    sizes = [_size(v) for v in closed.jaxpr.invars]
    rows = [_size(v) for v in closed.jaxpr.outvars]
    carried = 2 * sum(sizes[:n_state]) + (sum(sizes[n_state:]) if own else 0) + sum(rows[n_state:])
    leaves = 2 * n_state + (n_batch if own else 0) + len(rows) - n_state
    return Cost(walk.ops + TILE_OPS + leaves, walk.elements + TILE_OPS + carried, walk.nesting)


def _size(v) -> int:
    return int(np.prod(getattr(v.aval, "shape", ())))


class _Walk:
    """A jaxpr's operations and the nesting of its member-dependent loops: which values depend on the
    member (`run`'s `tainted` inputs) is propagated through every equation, into and out of the
    jaxprs it calls; a ``while`` whose predicate depends on the member nests one deeper."""

    def __init__(self) -> None:
        self.ops = self.elements = self.nesting = 0
        self._seen: dict = {}          # (id(jaxpr), tainted) -> tainted outputs, of the quiet walks

    def run(self, jaxpr, tainted: tuple, depth: int, count: bool = True) -> tuple:
        """The tainted outputs of `jaxpr` for `tainted` inputs; `count`: add its operations and loops
        (at loop `depth`) to the totals, else only propagate (memoized: a loop's fixed point)."""
        key = (id(jaxpr), tainted)
        if not count and key in self._seen:
            return self._seen[key]
        env = dict(zip(jaxpr.invars, tainted))
        for eqn in jaxpr.eqns:
            ins = tuple(not isinstance(v, Literal) and env.get(v, False) for v in eqn.invars)
            subs = list(jaxprs_in_params(eqn.params))
            if not subs:
                outs = (any(ins),) * len(eqn.outvars)
                if count:
                    self.ops += 1
                    self.elements += max([_size(v) for v in (*eqn.invars, *eqn.outvars)] or [1])
            elif eqn.primitive.name == "while" and "body_jaxpr" in eqn.params:
                outs = self._while(eqn, ins, depth, count)
            elif eqn.primitive.name == "scan" and "num_carry" in eqn.params:
                outs = self._scan(eqn, ins, depth, count)
            else:
                outs = self._call(eqn, ins, subs, depth, count)
            env.update(zip(eqn.outvars, outs))
        out = tuple(not isinstance(v, Literal) and env.get(v, False) for v in jaxpr.outvars)
        if not count:
            self._seen[key] = out
        return out

    def _while(self, eqn, ins, depth, count):
        cn, bn = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        cond, body = eqn.params["cond_jaxpr"].jaxpr, eqn.params["body_jaxpr"].jaxpr
        cconsts, bconsts, carry = ins[:cn], ins[cn:cn + bn], ins[cn + bn:]
        carry = self._fixed_point(body, bconsts, carry)
        member = self.run(cond, cconsts + carry, depth, count=False)[0]
        inner = depth + member
        if count:
            self.nesting = max(self.nesting, inner)
            self.run(cond, cconsts + carry, inner)
            self.run(body, bconsts + carry, inner)
        return carry

    def _scan(self, eqn, ins, depth, count):
        consts, ncarry = eqn.params["num_consts"], eqn.params["num_carry"]
        body = eqn.params["jaxpr"].jaxpr
        carry = self._fixed_point(body, ins[:consts], ins[consts:consts + ncarry], ins[consts + ncarry:])
        outs = self.run(body, ins[:consts] + carry + ins[consts + ncarry:], depth, count)
        return carry + outs[ncarry:]

    def _fixed_point(self, body, consts, carry, xs=()):
        """The carry's taint once the body's outputs (the carry first, then a scan's ys) add none."""
        while True:
            out = self.run(body, consts + carry + xs, 0, count=False)[:len(carry)]
            grown = tuple(a or b for a, b in zip(carry, out))
            if grown == carry:
                return carry
            carry = grown

    def _call(self, eqn, ins, subs, depth, count):
        """A call, branch or other equation holding jaxprs: each taking the equation's inputs (`cond`'s
        branches: all but its index) by position, else conservatively all tainted if any input is."""
        branch = eqn.primitive.name == "cond"
        args = ins[1:] if branch else ins
        outs = None
        for sub in subs:
            inner = getattr(sub, "jaxpr", sub)
            given = args if len(inner.invars) == len(args) else (any(ins),) * len(inner.invars)
            got = self.run(inner, given, depth, count)
            if len(got) == len(eqn.outvars) and len(inner.invars) == len(args):
                outs = got if outs is None else tuple(a or b for a, b in zip(outs, got))
        if outs is None:
            return (any(ins),) * len(eqn.outvars)
        return tuple(o or (branch and ins[0]) for o in outs)
