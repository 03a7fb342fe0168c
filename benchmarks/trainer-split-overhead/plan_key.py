import keras, numpy as np, tapeworks
from tapeworks.engine.plan import plan_cache
keras.utils.set_random_seed(0)
m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(3)])
t = tapeworks.Trainer(m, "adam", "mse", plan_cache=False, accumulate=2, clip_norm=1.0)
x = np.zeros((16, 4), "float32"); y = np.zeros((16, 3), "float32")
t.fit(x, y, batch_size=8, verbose=0)
try:
    key = plan_cache.fingerprint(t, 8)[0]
except TypeError:
    key = plan_cache.fingerprint(t.config, t.task, t.precision, t.training_state.element_spec, 8)[0]
print("KEY", key)
