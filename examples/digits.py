"""Train a flax nnx classifier on scikit-learn's handwritten digits (bundled: no download).

A shuffled `loopfuse.Dataset` on the device, `fit` running chunks of 100 steps inside the device
loop with a tqdm bar, stopping once the running training loss is small (`until=`), and orbax
checkpoints: given a checkpoint folder, interrupt it (Ctrl-C) and run it again, and it resumes
where it stopped, bitwise (a finished run restores its result and trains no more).

    python examples/digits.py [checkpoint folder]
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import loopfuse

OPTIMIZER = optax.adam(1e-3)
STEPS = 3000        # at most; `until` usually ends the run sooner
TARGET_LOSS = 0.01  # stop once the running average of the batch loss is below this


class Classifier(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(64, 128, rngs=rngs)
        self.out = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


def digits():
    """8x8 images scaled to [0, 1] as float32 rows of 64, and their labels: (train, test) dicts."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        (x / 16).astype(np.float32), y.astype(np.int32), test_size=0.2, random_state=0, stratify=y)
    return {"x": x_train, "y": y_train}, {"x": x_test, "y": y_test}


def make_step(graphdef):
    """The update of the model's parameters; the state is ``(params, opt_state, running loss)``."""
    def loss_fn(params, batch):
        logits = nnx.merge(graphdef, params)(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    def train_step(state, batch):
        params, opt_state, running = state
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, 0.95 * running + 0.05 * loss), {"loss": loss}

    return loopfuse.compile_step(train_step, keep_aux=("loss",))


def train(checkpoint_dir=None, steps: int = STEPS, progress: bool = True, callback=None):
    """Train from a fixed initialization; returns the `FitResult`, the model and its test accuracy."""
    train_set, test_set = digits()
    graphdef, params = nnx.split(Classifier(nnx.Rngs(0)))
    data = loopfuse.Dataset(train_set, batch_size=64, key=jax.random.key(0))    # reshuffled every epoch
    state = (params, OPTIMIZER.init(params), jnp.float32(jnp.log(10.0)))       # running loss: chance level
    result = loopfuse.fit(make_step(graphdef), state, data, steps, chunk=100, progress=progress,
                          until=lambda state, aux: state[2] < TARGET_LOSS, callback=callback,
                          checkpoint_dir=checkpoint_dir,
                          checkpoint_every=500 if checkpoint_dir else None)
    model = nnx.merge(graphdef, result.state[0])
    accuracy = float(jnp.mean(jnp.argmax(model(test_set["x"]), axis=-1) == test_set["y"]))
    return result, model, accuracy


def main(checkpoint_dir=None):
    result, _, accuracy = train(checkpoint_dir)
    resumed = f", resumed from step {result.resumed_from}" if result.resumed_from else ""
    print(f"{result.steps} steps ({result.retcode}{resumed}), last batch loss {result.history['loss'][-1]:.4f}, "
          f"test accuracy {accuracy:.2%}")
    return result, accuracy


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
