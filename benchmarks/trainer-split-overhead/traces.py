import keras, numpy as np, tapeworks
out = []
for mode in (False, True, "update"):
    for extra in ({}, {"monitor_every": 3}, {"accumulate": 2}):
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(3)])
        t = tapeworks.Trainer(m, "adam", "mse", plan_cache=False, jit_compile=mode, steps_per_call=2, **extra)
        x = np.random.default_rng(0).normal(size=(40, 4)).astype("float32"); y = x[:, :3]
        t.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_data=(x, y))
        t.evaluate(x, y, verbose=0); t.predict(x, verbose=0)
        out.append((mode, sorted(extra), dict(t.traces), [float(v) for v in t.model.get_weights()[0].ravel()[:3]]))
for row in out: print("ROW", row)
