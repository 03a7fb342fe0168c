# Source: keras-team/keras-io, examples/audio/ctc_asr.py (Setup through "Training and
# Evaluating"), commit ad4fc805f5e1a4a4c0bcdd416aa9feac6608fb6c (date not known here: the
# keras-io snapshot is too large to fetch, and the file index gives no date).
# Licence: Apache-2.0 (Copyright The Keras Authors).
# Changed, and nothing else: the downloaded LJSpeech-1.1 folder -> a folder of the same layout
# in a temporary directory (wavs/<id>.wav: mono 16-bit PCM at 22,050 Hz, written with
# tf.audio.encode_wav; metadata.csv: "id|transcription|normalized transcription" lines,
# quoting off), holding size(71, 36) clips (so the 90% split gives 63 / 32 training clips:
# 2 / 1 batches of 32), seeded by corpus_fit; the clips are 0.30-0.55 s of noise (LJSpeech's
# are 1-10 s: at those lengths this DeepSpeech2-like model, five bidirectional GRUs of 512
# units, needs minutes a batch on 2 CPU cores) and the transcriptions 1-3 short lower-case
# words (2-9 characters, so that CTC has enough frames for them); keras.utils.get_file's path
# -> that folder. pandas and jiwer are not installed here: when `import pandas` / `from jiwer
# import wer` fail, `pd` and `wer` are stand-ins (below) that do what the example asks of them
# with the same results (read_csv with sep="|", header=None, quoting=3; .columns = ...; column
# and column-list selection; .sample(frac=1) (numpy's global generator, seeded by
# corpus_fit, as pandas uses it without random_state); .reset_index(drop=True); .head(); len;
# row slices; and jiwer's corpus word error rate); with them installed the real ones run. The
# matplotlib/IPython imports and the "Visualize the data" section (plots, audio player)
# removed, and the "Inference" section after the fit; model.fit(...) -> history =
# corpus_fit.fit(model, ...) with the same arguments (the switch: see corpus_fit.py);
# corpus_fit.report(history) at the end. The example's own epochs = 1 is kept.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import os
import tempfile


class _FrameStandIn:
    """The part of a pandas DataFrame the example uses (pandas is not installed here)."""

    def __init__(self, rows, columns):
        self._rows = rows
        self.columns = columns

    def _column(self, name):
        j = list(self.columns).index(name)
        return [row[j] for row in self._rows]

    def __getitem__(self, key):
        if isinstance(key, slice):
            return _FrameStandIn(self._rows[key], self.columns)
        if isinstance(key, list):
            js = [list(self.columns).index(name) for name in key]
            return _FrameStandIn([[row[j] for j in js] for row in self._rows], list(key))
        return self._column(key)

    def sample(self, frac):
        import numpy as np
        order = np.random.permutation(len(self._rows))[: int(round(frac * len(self._rows)))]
        return _FrameStandIn([self._rows[i] for i in order], self.columns)

    def reset_index(self, drop):
        return self

    def head(self, n=5):
        return _FrameStandIn(self._rows[:n], self.columns)

    def __len__(self):
        return len(self._rows)


class _PandasStandIn:
    @staticmethod
    def read_csv(path, sep, header, quoting):
        with open(path, encoding="utf-8") as f:
            rows = [line.rstrip("\n").split(sep) for line in f if line.strip()]
        return _FrameStandIn(rows, list(range(len(rows[0]))))


def _wer_stand_in(references, hypotheses):
    """jiwer.wer on lists: word edits summed over pairs / reference words summed."""
    edits = words = 0
    for ref, hyp in zip(references, hypotheses):
        r, h = ref.split(), hyp.split()
        d = list(range(len(h) + 1))
        for i in range(1, len(r) + 1):
            prev, d[0] = d[0], i
            for j in range(1, len(h) + 1):
                prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r[i - 1] != h[j - 1]))
        edits += d[len(h)]
        words += len(r)
    return edits / max(words, 1)


"""
## Setup
"""

try:
    import pandas as pd
except ImportError:  # not installed here: the stand-in above
    pd = _PandasStandIn
import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers
try:
    from jiwer import wer
except ImportError:  # not installed here: the stand-in above
    wer = _wer_stand_in

# The downloaded LJSpeech-1.1 folder's stand-in: same layout, seeded, short clips.
_rng = np.random.default_rng(0)
_ljspeech = os.path.join(tempfile.mkdtemp(), "LJSpeech-1.1")
os.makedirs(os.path.join(_ljspeech, "wavs"))
_letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
with open(os.path.join(_ljspeech, "metadata.csv"), "w", encoding="utf-8") as _f:
    for _i in range(corpus_fit.size(71, 36)):
        _id = f"LJ{_i // 100 + 1:03d}-{_i % 100 + 1:04d}"
        _samples = int(_rng.integers(int(0.30 * 22050), int(0.55 * 22050)))
        _audio = (0.1 * _rng.standard_normal(_samples)).clip(-1, 1).astype(np.float32)
        tf.io.write_file(os.path.join(_ljspeech, "wavs", _id + ".wav"),
                         tf.audio.encode_wav(_audio[:, None], 22050))
        _text = " ".join("".join(_rng.choice(_letters, int(_rng.integers(2, 4))))
                         for _ in range(int(_rng.integers(1, 3))))
        _f.write(f"{_id}|{_text.capitalize()}.|{_text.capitalize()}.\n")

"""
## Load the LJSpeech Dataset
"""

data_path = _ljspeech
wavs_path = data_path + "/wavs/"
metadata_path = data_path + "/metadata.csv"


# Read metadata file and parse it
metadata_df = pd.read_csv(metadata_path, sep="|", header=None, quoting=3)
metadata_df.columns = ["file_name", "transcription", "normalized_transcription"]
metadata_df = metadata_df[["file_name", "normalized_transcription"]]
metadata_df = metadata_df.sample(frac=1).reset_index(drop=True)
metadata_df.head(3)


"""
We now split the data into training and validation set.
"""

split = int(len(metadata_df) * 0.90)
df_train = metadata_df[:split]
df_val = metadata_df[split:]

print(f"Size of the training set: {len(df_train)}")
print(f"Size of the training set: {len(df_val)}")


"""
## Preprocessing

We first prepare the vocabulary to be used.
"""

# The set of characters accepted in the transcription.
characters = [x for x in "abcdefghijklmnopqrstuvwxyz'?! "]
# Mapping characters to integers
char_to_num = keras.layers.StringLookup(vocabulary=characters, oov_token="")
# Mapping integers back to original characters
num_to_char = keras.layers.StringLookup(
    vocabulary=char_to_num.get_vocabulary(), oov_token="", invert=True
)

print(
    f"The vocabulary is: {char_to_num.get_vocabulary()} "
    f"(size ={char_to_num.vocabulary_size()})"
)

"""
Next, we create the function that describes the transformation that we apply to each
element of our dataset.
"""

# An integer scalar Tensor. The window length in samples.
frame_length = 256
# An integer scalar Tensor. The number of samples to step.
frame_step = 160
# An integer scalar Tensor. The size of the FFT to apply.
# If not provided, uses the smallest power of 2 enclosing frame_length.
fft_length = 384


def encode_single_sample(wav_file, label):
    ###########################################
    ##  Process the Audio
    ##########################################
    # 1. Read wav file
    file = tf.io.read_file(wavs_path + wav_file + ".wav")
    # 2. Decode the wav file
    audio, _ = tf.audio.decode_wav(file)
    audio = tf.squeeze(audio, axis=-1)
    # 3. Change type to float
    audio = tf.cast(audio, tf.float32)
    # 4. Get the spectrogram
    spectrogram = tf.signal.stft(
        audio, frame_length=frame_length, frame_step=frame_step, fft_length=fft_length
    )
    # 5. We only need the magnitude, which can be derived by applying tf.abs
    spectrogram = tf.abs(spectrogram)
    spectrogram = tf.math.pow(spectrogram, 0.5)
    # 6. normalisation
    means = tf.math.reduce_mean(spectrogram, 1, keepdims=True)
    stddevs = tf.math.reduce_std(spectrogram, 1, keepdims=True)
    spectrogram = (spectrogram - means) / (stddevs + 1e-10)
    ###########################################
    ##  Process the label
    ##########################################
    # 7. Convert label to Lower case
    label = tf.strings.lower(label)
    # 8. Split the label
    label = tf.strings.unicode_split(label, input_encoding="UTF-8")
    # 9. Map the characters in label to numbers
    label = char_to_num(label)
    # 10. Return a dict as our model is expecting two inputs
    return spectrogram, label


"""
## Creating `Dataset` objects

We create a `tf.data.Dataset` object that yields
the transformed elements, in the same order as they
appeared in the input.
"""

batch_size = 32
# Define the trainig dataset
train_dataset = tf.data.Dataset.from_tensor_slices(
    (list(df_train["file_name"]), list(df_train["normalized_transcription"]))
)
train_dataset = (
    train_dataset.map(encode_single_sample, num_parallel_calls=tf.data.AUTOTUNE)
    .padded_batch(batch_size)
    .prefetch(buffer_size=tf.data.AUTOTUNE)
)

# Define the validation dataset
validation_dataset = tf.data.Dataset.from_tensor_slices(
    (list(df_val["file_name"]), list(df_val["normalized_transcription"]))
)
validation_dataset = (
    validation_dataset.map(encode_single_sample, num_parallel_calls=tf.data.AUTOTUNE)
    .padded_batch(batch_size)
    .prefetch(buffer_size=tf.data.AUTOTUNE)
)


"""
## Model

We first define the CTC Loss function.
"""


def CTCLoss(y_true, y_pred):
    # Compute the training-time loss value
    batch_len = tf.cast(tf.shape(y_true)[0], dtype="int64")
    input_length = tf.cast(tf.shape(y_pred)[1], dtype="int64")
    label_length = tf.cast(tf.shape(y_true)[1], dtype="int64")

    input_length = input_length * tf.ones(shape=(batch_len, 1), dtype="int64")
    label_length = label_length * tf.ones(shape=(batch_len, 1), dtype="int64")

    loss = keras.backend.ctc_batch_cost(y_true, y_pred, input_length, label_length)
    return loss


"""
We now define our model. We will define a model similar to
[DeepSpeech2](https://nvidia.github.io/OpenSeq2Seq/html/speech-recognition/deepspeech2.html).
"""


def build_model(input_dim, output_dim, rnn_layers=5, rnn_units=128):
    """Model similar to DeepSpeech2."""
    # Model's input
    input_spectrogram = layers.Input((None, input_dim), name="input")
    # Expand the dimension to use 2D CNN.
    x = layers.Reshape((-1, input_dim, 1), name="expand_dim")(input_spectrogram)
    # Convolution layer 1
    x = layers.Conv2D(
        filters=32,
        kernel_size=[11, 41],
        strides=[2, 2],
        padding="same",
        use_bias=False,
        name="conv_1",
    )(x)
    x = layers.BatchNormalization(name="conv_1_bn")(x)
    x = layers.ReLU(name="conv_1_relu")(x)
    # Convolution layer 2
    x = layers.Conv2D(
        filters=32,
        kernel_size=[11, 21],
        strides=[1, 2],
        padding="same",
        use_bias=False,
        name="conv_2",
    )(x)
    x = layers.BatchNormalization(name="conv_2_bn")(x)
    x = layers.ReLU(name="conv_2_relu")(x)
    # Reshape the resulted volume to feed the RNNs layers
    x = layers.Reshape((-1, x.shape[-2] * x.shape[-1]))(x)
    # RNN layers
    for i in range(1, rnn_layers + 1):
        recurrent = layers.GRU(
            units=rnn_units,
            activation="tanh",
            recurrent_activation="sigmoid",
            use_bias=True,
            return_sequences=True,
            reset_after=True,
            name=f"gru_{i}",
        )
        x = layers.Bidirectional(
            recurrent, name=f"bidirectional_{i}", merge_mode="concat"
        )(x)
        if i < rnn_layers:
            x = layers.Dropout(rate=0.5)(x)
    # Dense layer
    x = layers.Dense(units=rnn_units * 2, name="dense_1")(x)
    x = layers.ReLU(name="dense_1_relu")(x)
    x = layers.Dropout(rate=0.5)(x)
    # Classification layer
    output = layers.Dense(units=output_dim + 1, activation="softmax")(x)
    # Model
    model = keras.Model(input_spectrogram, output, name="DeepSpeech_2")
    # Optimizer
    opt = keras.optimizers.Adam(learning_rate=1e-4)
    # Compile the model and return
    model.compile(optimizer=opt, loss=CTCLoss)
    return model


# Get the model
model = build_model(
    input_dim=fft_length // 2 + 1,
    output_dim=char_to_num.vocabulary_size(),
    rnn_units=512,
)
model.summary(line_length=110)

"""
## Training and Evaluating
"""

# A utility function to decode the output of the network
def decode_batch_predictions(pred):
    input_len = np.ones(pred.shape[0]) * pred.shape[1]
    # Use greedy search. For complex tasks, you can use beam search
    results = keras.backend.ctc_decode(pred, input_length=input_len, greedy=True)[0][0]
    # Iterate over the results and get back the text
    output_text = []
    for result in results:
        result = tf.strings.reduce_join(num_to_char(result)).numpy().decode("utf-8")
        output_text.append(result)
    return output_text


# A callback class to output a few transcriptions during training
class CallbackEval(keras.callbacks.Callback):
    """Displays a batch of outputs after every epoch."""

    def __init__(self, dataset):
        super().__init__()
        self.dataset = dataset

    def on_epoch_end(self, epoch: int, logs=None):
        predictions = []
        targets = []
        for batch in self.dataset:
            X, y = batch
            batch_predictions = model.predict(X)
            batch_predictions = decode_batch_predictions(batch_predictions)
            predictions.extend(batch_predictions)
            for label in y:
                label = (
                    tf.strings.reduce_join(num_to_char(label)).numpy().decode("utf-8")
                )
                targets.append(label)
        wer_score = wer(targets, predictions)
        print("-" * 100)
        print(f"Word Error Rate: {wer_score:.4f}")
        print("-" * 100)
        for i in np.random.randint(0, len(predictions), 2):
            print(f"Target    : {targets[i]}")
            print(f"Prediction: {predictions[i]}")
            print("-" * 100)


"""
Let's start the training process.
"""

# Define the number of epochs.
epochs = 1
# Callback function to check transcription on the val set.
validation_callback = CallbackEval(validation_dataset)
# Train the model
history = corpus_fit.fit(
    model,
    train_dataset,
    validation_data=validation_dataset,
    epochs=epochs,
    callbacks=[validation_callback],
)

corpus_fit.report(history)
