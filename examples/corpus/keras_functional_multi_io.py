# Source: keras-team/keras, guides/functional_api.py (Setup; "Models with multiple inputs and
# outputs"), commit 3422977a5e38fb2f7709aaa9a08e47f0c43d0f60 (2026-08-21). Licence: Apache-2.0
# (Copyright The Keras Authors).
# Changed, and nothing else: the guide's dummy data (np.random, seeded by corpus_fit) 1280 rows ->
# size(1280, 192) rows of the same shapes and dtypes; epochs 2 -> size(2, 1);
# keras.utils.plot_model (needs pydot) removed; the guide's other sections not taken;
# model.fit(...) -> corpus_fit.fit(model, ...) with the same arguments (the switch: see
# corpus_fit.py), its result kept as `history`; corpus_fit.report(history) at the end. Both
# compile calls are kept (the second, by output name, is the one that trains).
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import numpy as np
import keras
from keras import layers
from keras import ops

num_tags = 12  # Number of unique issue tags
num_words = 10000  # Size of vocabulary obtained when preprocessing text data
num_departments = 4  # Number of departments for predictions

title_input = keras.Input(
    shape=(None,), name="title"
)  # Variable-length sequence of ints
body_input = keras.Input(
    shape=(None,), name="body"
)  # Variable-length sequence of ints
tags_input = keras.Input(
    shape=(num_tags,), name="tags"
)  # Binary vectors of size `num_tags`

# Embed each word in the title into a 64-dimensional vector
title_features = layers.Embedding(num_words, 64)(title_input)
# Embed each word in the text into a 64-dimensional vector
body_features = layers.Embedding(num_words, 64)(body_input)

# Reduce sequence of embedded words in the title into a single 128-dimensional vector
title_features = layers.LSTM(128)(title_features)
# Reduce sequence of embedded words in the body into a single 32-dimensional vector
body_features = layers.LSTM(32)(body_features)

# Merge all available features into a single large vector via concatenation
x = layers.concatenate([title_features, body_features, tags_input])

# Stick a logistic regression for priority prediction on top of the features
priority_pred = layers.Dense(1, name="priority")(x)
# Stick a department classifier on top of the features
department_pred = layers.Dense(num_departments, name="department")(x)

# Instantiate an end-to-end model predicting both priority and department
model = keras.Model(
    inputs=[title_input, body_input, tags_input],
    outputs={"priority": priority_pred, "department": department_pred},
)

model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss=[
        keras.losses.BinaryCrossentropy(from_logits=True),
        keras.losses.CategoricalCrossentropy(from_logits=True),
    ],
    loss_weights=[1.0, 0.2],
)

model.compile(
    optimizer=keras.optimizers.RMSprop(1e-3),
    loss={
        "priority": keras.losses.BinaryCrossentropy(from_logits=True),
        "department": keras.losses.CategoricalCrossentropy(from_logits=True),
    },
    loss_weights={"priority": 1.0, "department": 0.2},
)

# Dummy input data
title_data = np.random.randint(num_words, size=(corpus_fit.size(1280, 192), 10))
body_data = np.random.randint(num_words, size=(corpus_fit.size(1280, 192), 100))
tags_data = np.random.randint(2, size=(corpus_fit.size(1280, 192), num_tags)).astype("float32")

# Dummy target data
priority_targets = np.random.random(size=(corpus_fit.size(1280, 192), 1))
dept_targets = np.random.randint(2, size=(corpus_fit.size(1280, 192), num_departments))

history = corpus_fit.fit(
    model,
    {"title": title_data, "body": body_data, "tags": tags_data},
    {"priority": priority_targets, "department": dept_targets},
    epochs=corpus_fit.size(2, 1),
    batch_size=32,
)

corpus_fit.report(history)
