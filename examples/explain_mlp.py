"""`explain` on a small MLP at one step per call: where its time goes, and what would help.

    python examples/explain_mlp.py            # prints the explanation
    python -m tapeworks.explain explain_mlp:make   # the same, from examples/ as the working folder

`make()` is the entry point `python -m tapeworks.explain` calls: it returns
the trainer and its data. The README's example output came from this script
(kept in benchmarks/explain-example.md).
"""

import argparse

import keras
import numpy as np

import tapeworks


def make(samples=2048):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 32)).astype("float32")
    y = rng.integers(0, 10, samples)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trainer = tapeworks.Trainer(model, "adam", loss, steps_per_call=1)
    return trainer, (x, y)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and steps")
    args = parser.parse_args()
    trainer, (x, y) = make(256 if args.quick else 2048)
    trainer.fit(x, y, batch_size=32, epochs=1, verbose=0)
    print(trainer.explain((x, y), batch_size=32, steps=4 if args.quick else 20,
                          try_xla=not args.quick))


if __name__ == "__main__":
    main()
