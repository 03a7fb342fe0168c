"""Issue 38's case on all 1,797 digits: int8 export with in-graph Normalization, no sample=."""
import time, numpy as np, tensorflow as tf, keras
from sklearn.datasets import load_digits
import tapeworks
from tapeworks.deploy import export
d = load_digits(); X = d.data.astype("float32"); Y = d.target.astype("int32")
x, y = X[:1149], Y[:1149]
keras.utils.set_random_seed(0)
norm = keras.layers.Normalization(); norm.adapt(x)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
tapeworks.Trainer(model, seed=0).fit(np.asarray(norm(x)), y, batch_size=32, epochs=20, verbose=0)
rep = tf.data.Dataset.from_tensor_slices(x).batch(32)
t = time.time()
report = export(model, "digits_int8.tflite", format="tflite", preprocessing=norm, quantize="int8", representative_data=rep)
print("export seconds", round(time.time() - t, 1))
print(report)
from ai_edge_litert.interpreter import Interpreter
it = Interpreter(model_path="digits_int8.tflite"); run = it.get_signature_runner("serving_default")
name = list(run.get_input_details())[0]
out = []
for i in range(0, len(X), 1):
    r = run(**{name: X[i:i+1]}); out.append(list(r.values())[0])
out = np.concatenate(out)
ref = np.asarray(model(norm(X)))
agree = np.mean(out.argmax(1) == ref.argmax(1))
print(f"argmax agreement on all {len(X)} digits: {100*agree:.2f}%  accuracy float {np.mean(ref.argmax(1)==Y)*100:.2f}% int8 {np.mean(out.argmax(1)==Y)*100:.2f}%")
