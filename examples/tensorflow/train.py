"""TensorFlow 2 data parallelism with ``smdistributed.dataparallel.tensorflow``: each rank
trains on its shard, ``DistributedGradientTape`` averages the gradients across ranks, and the
variables are broadcast from rank 0 after the first step. Runs on SageMaker and in Shoal's
local mode; the data is scikit-learn's 8x8 digits.
"""

import argparse
import json
import os

import numpy as np
import smdistributed.dataparallel.tensorflow as sdp
import tensorflow as tf

sdp.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[sdp.local_rank()], "GPU")
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


def load_data(channel):
    if channel and os.path.exists(os.path.join(channel, "digits.npz")):
        data = np.load(os.path.join(channel, "digits.npz"))
        return data["x_train"], data["y_train"], data["x_test"], data["y_test"]
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x / 16.0, y, test_size=0.2, random_state=0, stratify=y)
    return x_train, y_train, x_test, y_test


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--sm-model-dir", type=str, default=os.environ.get("SM_MODEL_DIR", "model"))
    parser.add_argument("--train", type=str, default=os.environ.get("SM_CHANNEL_TRAIN"))
    # The TensorFlow estimator passes --model_dir (where TF may write checkpoints); the final
    # model goes to SM_MODEL_DIR, which SageMaker uploads as model.tar.gz.
    parser.add_argument("--model_dir", type=str)
    args = parser.parse_args()

    if sdp.rank() == 0:
        print(f"world size {sdp.size()}")
    x_train, y_train, x_test, y_test = load_data(args.train)
    dataset = (tf.data.Dataset.from_tensor_slices((x_train.astype("float32"), y_train))
               .shard(sdp.size(), sdp.rank())
               .shuffle(2048, seed=0)
               .batch(args.batch_size, drop_remainder=True))

    tf.random.set_seed(0)
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(64,)),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Scale the learning rate by the number of ranks (linear scaling rule).
    opt = tf.keras.optimizers.Adam(args.lr * sdp.size())

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            loss_value = loss_fn(labels, model(images, training=True))
        tape = sdp.DistributedGradientTape(tape)
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            sdp.broadcast_variables(model.variables, root_rank=0)
            sdp.broadcast_variables(opt.variables, root_rank=0)
        return loss_value

    first = True
    for epoch in range(1, args.epochs + 1):
        for images, labels in dataset:
            loss_value = training_step(images, labels, first)
            first = False
        if sdp.rank() == 0:
            print(f"epoch {epoch} loss {float(loss_value):.4f}")

    if sdp.rank() == 0:
        logits = model(x_test.astype("float32"), training=False)
        accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
        print(f"held-out accuracy {accuracy:.4f}")
        os.makedirs(args.sm_model_dir, exist_ok=True)
        model.save_weights(os.path.join(args.sm_model_dir, "model.weights.h5"))
        with open(os.path.join(args.sm_model_dir, "metrics.json"), "w") as f:
            json.dump({"accuracy": accuracy}, f)


if __name__ == "__main__":
    main()
