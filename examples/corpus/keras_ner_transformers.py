# Source: keras-team/keras-io, examples/nlp/ner_transformers.py (Setup through "Compile and fit
# the model"), commit a72c25d44070de47f97dda830d0fc7668489be92 (date not known here: the
# keras-io snapshot is too large to fetch, and the file index gives no date).
# Licence: Apache-2.0 (Copyright The Keras Authors).
# Changed, and nothing else: load_dataset("conll2003") (Hugging Face `datasets`, not installed
# here, and a download) -> conll_data, a stand-in of the same structure (splits "train" and
# "validation"; records with "tokens", a list of str, and "ner_tags", ints 0-8, mostly 0 as in
# CoNLL; sentences of 1-40 tokens drawn from a 3,000-word vocabulary of capitalised and lower
# case words and punctuation; size(4000, 160) train and size(400, 64) validation sentences,
# seeded by corpus_fit), written by the example's own export_to_file and read back by its own
# TextLineDataset / map / padded_batch pipeline; os.mkdir("data") made inside a temporary
# folder (one os.chdir line, and `import tempfile`), so nothing is written beside this script;
# `from conlleval import evaluate` (a downloaded script) dropped, and with it the sample
# inference and "Metrics calculation" after the fit; epochs 10 -> size(3, 1);
# ner_model.fit(...) -> history =
# corpus_fit.fit(ner_model, ...) with the same arguments (the switch: see corpus_fit.py);
# corpus_fit.report(history) at the end. Kept as upstream has them: the custom
# keras.losses.Loss subclass that masks padded tokens (tag 0) out of the loss, and its
# from_logits=True on a softmax output; `keras` is tf.keras here (`from tensorflow import
# keras`), whose legacy keras.losses.Reduction.NONE still exists.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import os
import tempfile
import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers
from collections import Counter

"""
We will be using the transformer implementation from this fantastic
[example](https://keras.io/examples/nlp/text_classification_with_transformer/).

Let's start by defining a `TransformerBlock` layer:
"""


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super(TransformerBlock, self).__init__()
        self.att = keras.layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=embed_dim
        )
        self.ffn = keras.Sequential(
            [
                keras.layers.Dense(ff_dim, activation="relu"),
                keras.layers.Dense(embed_dim),
            ]
        )
        self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = keras.layers.Dropout(rate)
        self.dropout2 = keras.layers.Dropout(rate)

    def call(self, inputs, training=False):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
        return self.layernorm2(out1 + ffn_output)


"""
Next, let's define a `TokenAndPositionEmbedding` layer:
"""


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super(TokenAndPositionEmbedding, self).__init__()
        self.token_emb = keras.layers.Embedding(
            input_dim=vocab_size, output_dim=embed_dim
        )
        self.pos_emb = keras.layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, inputs):
        maxlen = tf.shape(inputs)[-1]
        positions = tf.range(start=0, limit=maxlen, delta=1)
        position_embeddings = self.pos_emb(positions)
        token_embeddings = self.token_emb(inputs)
        return token_embeddings + position_embeddings


"""
## Build the NER model class as a `keras.Model` subclass
"""


class NERModel(keras.Model):
    def __init__(
        self, num_tags, vocab_size, maxlen=128, embed_dim=32, num_heads=2, ff_dim=32
    ):
        super(NERModel, self).__init__()
        self.embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
        self.transformer_block = TransformerBlock(embed_dim, num_heads, ff_dim)
        self.dropout1 = layers.Dropout(0.1)
        self.ff = layers.Dense(ff_dim, activation="relu")
        self.dropout2 = layers.Dropout(0.1)
        self.ff_final = layers.Dense(num_tags, activation="softmax")

    def call(self, inputs, training=False):
        x = self.embedding_layer(inputs)
        x = self.transformer_block(x)
        x = self.dropout1(x, training=training)
        x = self.ff(x)
        x = self.dropout2(x, training=training)
        x = self.ff_final(x)
        return x


"""
## Load the CoNLL 2003 dataset from the datasets library and process it
"""


# The CoNLL 2003 stand-in: what load_dataset("conll2003") gives the example (a split is
# iterable over records and indexable by column name).
class _Split:
    def __init__(self, records):
        self._records = records

    def __iter__(self):
        return iter(self._records)

    def __getitem__(self, column):
        return [record[column] for record in self._records]


def _conll_split(rng, sentences, words):
    records = []
    for _ in range(sentences):
        length = int(rng.integers(1, 41))
        tokens = [str(w) for w in rng.choice(words, length)]
        ner_tags = [int(t) for t in rng.choice(9, length, p=[0.83] + [0.17 / 8] * 8)]
        records.append({"tokens": tokens, "ner_tags": ner_tags})
    return _Split(records)


_rng = np.random.default_rng(0)
_letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
_words = np.array(
    ["".join(_rng.choice(_letters, int(_rng.integers(2, 10)))) for _ in range(2990)]
    + [".", ",", "(", ")", "-", '"', ":", "'s", "$", "%"],
    dtype=object,
)
_words[:1500] = [w.capitalize() for w in _words[:1500]]
conll_data = {
    "train": _conll_split(_rng, corpus_fit.size(4000, 160), _words),
    "validation": _conll_split(_rng, corpus_fit.size(400, 64), _words),
}

"""
We will export this data to a tab-separated file format which will be easy to read as a
`tf.data.Dataset` object.
"""


def export_to_file(export_file_path, data):
    with open(export_file_path, "w") as f:
        for record in data:
            ner_tags = record["ner_tags"]
            tokens = record["tokens"]
            if len(tokens) > 0:
                f.write(
                    str(len(tokens))
                    + "\t"
                    + "\t".join(tokens)
                    + "\t"
                    + "\t".join(map(str, ner_tags))
                    + "\n"
                )


os.chdir(tempfile.mkdtemp())  # so that "data" is made in a temporary folder
os.mkdir("data")
export_to_file("./data/conll_train.txt", conll_data["train"])
export_to_file("./data/conll_val.txt", conll_data["validation"])

"""
## Make the NER label lookup table
"""


def make_tag_lookup_table():
    iob_labels = ["B", "I"]
    ner_labels = ["PER", "ORG", "LOC", "MISC"]
    all_labels = [(label1, label2) for label2 in ner_labels for label1 in iob_labels]
    all_labels = ["-".join([a, b]) for a, b in all_labels]
    all_labels = ["[PAD]", "O"] + all_labels
    return dict(zip(range(0, len(all_labels) + 1), all_labels))


mapping = make_tag_lookup_table()
print(mapping)

"""
Get a list of all tokens in the training dataset. This will be used to create the
vocabulary.
"""

all_tokens = sum(conll_data["train"]["tokens"], [])
all_tokens_array = np.array(list(map(str.lower, all_tokens)))

counter = Counter(all_tokens_array)
print(len(counter))

num_tags = len(mapping)
vocab_size = 20000

# We only take (vocab_size - 2) most commons words from the training data since
# the `StringLookup` class uses 2 additional tokens - one denoting an unknown
# token and another one denoting a masking token
vocabulary = [token for token, count in counter.most_common(vocab_size - 2)]

# The StringLook class will convert tokens to token IDs
lookup_layer = keras.layers.StringLookup(vocabulary=vocabulary)

"""
Create 2 new `Dataset` objects from the training and validation data
"""

train_data = tf.data.TextLineDataset("./data/conll_train.txt")
val_data = tf.data.TextLineDataset("./data/conll_val.txt")

"""
Print out one line to make sure it looks good. The first record in the line is the number of tokens. 
After that we will have all the tokens followed by all the ner tags.
"""

print(list(train_data.take(1).as_numpy_iterator()))

"""
We will be using the following map function to transform the data in the dataset:
"""


def map_record_to_training_data(record):
    record = tf.strings.split(record, sep="\t")
    length = tf.strings.to_number(record[0], out_type=tf.int32)
    tokens = record[1 : length + 1]
    tags = record[length + 1 :]
    tags = tf.strings.to_number(tags, out_type=tf.int64)
    tags += 1
    return tokens, tags


def lowercase_and_convert_to_ids(tokens):
    tokens = tf.strings.lower(tokens)
    return lookup_layer(tokens)


# We use `padded_batch` here because each record in the dataset has a
# different length.
batch_size = 32
train_dataset = (
    train_data.map(map_record_to_training_data)
    .map(lambda x, y: (lowercase_and_convert_to_ids(x), y))
    .padded_batch(batch_size)
)
val_dataset = (
    val_data.map(map_record_to_training_data)
    .map(lambda x, y: (lowercase_and_convert_to_ids(x), y))
    .padded_batch(batch_size)
)

ner_model = NERModel(num_tags, vocab_size, embed_dim=32, num_heads=4, ff_dim=64)

"""
We will be using a custom loss function that will ignore the loss from padded tokens.
"""


class CustomNonPaddingTokenLoss(keras.losses.Loss):
    def __init__(self, name="custom_ner_loss"):
        super().__init__(name=name)

    def call(self, y_true, y_pred):
        loss_fn = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=keras.losses.Reduction.NONE
        )
        loss = loss_fn(y_true, y_pred)
        mask = tf.cast((y_true > 0), dtype=tf.float32)
        loss = loss * mask
        return tf.reduce_sum(loss) / tf.reduce_sum(mask)


loss = CustomNonPaddingTokenLoss()

"""
## Compile and fit the model
"""

ner_model.compile(optimizer="adam", loss=loss)
history = corpus_fit.fit(ner_model, train_dataset, epochs=corpus_fit.size(3, 1))

corpus_fit.report(history)
