"""Shoal's TensorFlow data-parallel API under the real mpirun: collectives of TF tensors
match numpy for every dtype and op (eagerly and in tf.function), DistributedGradientTape and
DistributedOptimizer train a Keras model to the weights a single process reaches on the
concatenated batches, broadcast_variables makes ranks agree, and an unchanged
smdistributed-style TF2 script runs.

This file is also the rank program: ``python test_tensorflow_dataparallel.py worker`` runs
every check on one rank, so each configuration costs one TensorFlow import per rank.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

MPIRUN = shutil.which("mpirun")
HERE = os.path.abspath(__file__)

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.runtime,
    pytest.mark.tensorflow,
    pytest.mark.slow,
    pytest.mark.skipif(MPIRUN is None, reason="mpirun (Open MPI) is not installed"),
]

DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
OPS = ("AVERAGE", "SUM", "MIN", "MAX")
SIZES = (1, 7, 4099)
STEPS = 20
BATCH = 8  # per rank


def run_ranks(n: int, argv: list[str], timeout: int = 900) -> str:
    """Runs ``argv`` as ``n`` ranks under mpirun; fails with the ranks' output."""
    env = {**os.environ, "SHOAL_COLLECTIVE_TIMEOUT": "120", "TF_CPP_MIN_LOG_LEVEL": "2",
           "OMP_NUM_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1"}
    command = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n), *argv]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-6000:]}\nstderr:\n{done.stderr[-6000:]}"
    return done.stdout


@pytest.mark.parametrize("ranks, hosts", [(2, 1), (4, 2)])
def test_collectives_and_training_match_numpy_and_one_process(ranks, hosts):
    """Four ranks run as two simulated hosts of two (SHOAL_HOST per rank, as Shoal's
    launcher sets it), so the core's inter-host path carries half of every reduction."""
    per_host = ranks // hosts
    worker = f'exec "{sys.executable}" "{HERE}" worker'
    if hosts > 1:
        worker = f"SHOAL_HOST=h$((OMPI_COMM_WORLD_RANK / {per_host})) {worker}"
    out = run_ranks(ranks, ["bash", "-c", worker])
    for check in ("collectives ok", "tape training ok", "keras fit ok"):
        assert out.count(check) == ranks, out
    for local in range(per_host):
        assert out.count(f"local {local}/{per_host} size {ranks}") == hosts, out


SDP_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import tensorflow as tf

    import smdistributed.dataparallel.tensorflow as sdp

    sdp.init()

    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[sdp.local_rank()], "GPU")

    rng = np.random.default_rng(sdp.rank())
    images = rng.standard_normal((256, 28, 28)).astype("float32")
    labels = rng.integers(0, 10, 256).astype("int64")
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().shuffle(64).batch(32)

    tf.random.set_seed(sdp.rank())  # different replicas: the broadcast must align them
    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Flatten(input_shape=(28, 28)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    loss = tf.losses.SparseCategoricalCrossentropy()
    opt = tf.optimizers.Adam(0.000125 * sdp.size())

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        tape = sdp.DistributedGradientTape(tape)

        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

        if first_batch:
            sdp.broadcast_variables(mnist_model.variables, root_rank=0)
            sdp.broadcast_variables(opt.variables, root_rank=0)

        return loss_value

    for batch, (images, labels) in enumerate(dataset.take(30)):
        loss_value = training_step(images, labels, batch == 0)
        if batch % 10 == 0 and sdp.rank() == 0:
            print("Step #%d\\tLoss: %.6f" % (batch, loss_value))

    mean_loss = sdp.oob_allreduce(loss_value)
    flat = tf.concat([tf.reshape(v, [-1]) for v in mnist_model.variables], 0)
    copies = sdp.allgather(tf.expand_dims(flat, 0)).numpy()
    assert (copies == copies[0]).all(), "replicas diverged"
    print(f"rank {sdp.rank()} local {sdp.local_rank()}/{sdp.local_size()} size {sdp.size()} "
          f"mean loss {float(mean_loss):.4f}", flush=True)
    if sdp.rank() == 0:
        print("sdp script ok", flush=True)
    sdp.shutdown()
    """
)


def test_unchanged_smdistributed_tf2_script_runs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SDP_SCRIPT)
    out = run_ranks(2, [sys.executable, str(script)])
    assert "sdp script ok" in out
    assert "local 1/2 size 2" in out and "local 0/2 size 2" in out


# ---- rank program ---------------------------------------------------------------------


def rank_input(rank, n, dtype, op, seed):
    """Rank ``rank``'s input, reproducible on every rank (each computes the answer)."""
    rng = np.random.default_rng((seed, rank))
    if dtype.startswith("int"):
        return rng.integers(-1000, 1000, size=n).astype(dtype)
    return rng.standard_normal(n)


def expected(inputs, dtype, op, world):
    stack = np.stack(inputs)
    if dtype.startswith("int"):
        stack = stack.astype(np.int64)
        if op == "AVERAGE":
            summed = stack.sum(0)
            return np.sign(summed) * (np.abs(summed) // world)  # truncation, as the core
        return {"SUM": stack.sum, "MIN": stack.min, "MAX": stack.max}[op](0)
    return {"AVERAGE": stack.mean, "SUM": stack.sum, "MIN": stack.min, "MAX": stack.max}[op](0)


def tolerance(dtype, world):
    return {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3 * world,
            "bfloat16": 1.6e-2 * world}.get(dtype, 0)


def check_allreduce(sdp, tf, rank, world) -> int:
    cases, seed = 0, 0

    @tf.function
    def in_graph(tensor, op):
        return sdp.allreduce(tensor, 0, 1, op=op)

    for dtype in DTYPES:
        for op in OPS:
            for n in SIZES:
                seed += 1
                # Inputs are first rounded to the dtype, as the ranks hold them.
                inputs = [tf.cast(rank_input(r, n, dtype, op, seed), dtype).numpy().astype(np.float64)
                          for r in range(world)]
                tensor = tf.cast(inputs[rank], dtype)
                want = expected(inputs, dtype, op, world)
                eager = lambda t, o: sdp.allreduce(t, 0, 1, op=o)  # noqa: E731
                # Each graph case costs a trace: one size is enough there.
                for run in (eager, in_graph) if n == 7 else (eager,):
                    got = run(tensor, getattr(sdp.ReduceOp, op))
                    assert got.dtype == tensor.dtype and got.shape == tensor.shape, (dtype, op, got)
                    tol = tolerance(dtype, world)
                    np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=tol, atol=tol,
                                               err_msg=f"{dtype} {op} n={n}")
                    cases += 1
    return cases


def check_compression(sdp, tf, rank, world) -> int:
    inputs = [np.random.default_rng((5, r)).standard_normal(1000).astype(np.float32) for r in range(world)]
    got = sdp.allreduce(tf.constant(inputs[rank]), 0, 1, compression=sdp.Compression.fp16,
                        op=sdp.ReduceOp.SUM).numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.sum(inputs, 0), rtol=5e-3 * world, atol=5e-3 * world)
    # The sum travelled as float16: every value is one that float16 can hold.
    assert np.array_equal(got, got.astype(np.float16).astype(np.float32))
    exact = sdp.oob_allreduce(tf.constant(inputs[rank])).numpy()
    np.testing.assert_allclose(exact, np.mean(inputs, 0), rtol=1e-6, atol=1e-6)
    assert not np.array_equal(exact, exact.astype(np.float16).astype(np.float32))
    return 2


def check_grouped_and_sparse(sdp, tf, rank, world) -> int:
    # Many small tensors of mixed dtypes through one fused op.
    shapes = [(3,), (2, 5), (), (17, 3), (1,)] * 6
    dtypes = ["float32", "float64", "int64", "float16", "int32"] * 6
    per_rank = [[np.random.default_rng((9, i, r)).integers(-50, 50, s).astype(d)
                 for i, (s, d) in enumerate(zip(shapes, dtypes))] for r in range(world)]
    got = sdp.grouped_allreduce([tf.constant(a) for a in per_rank[rank]], op=sdp.ReduceOp.SUM)
    for i, tensor in enumerate(got):
        want = sum(per_rank[r][i].astype(np.int64) for r in range(world))
        assert tensor.shape == shapes[i] and tensor.dtype.name == dtypes[i]
        assert np.array_equal(tensor.numpy().astype(np.int64), want), i
    # IndexedSlices: every rank's rows gathered; densified, the average of the dense gradients.
    dense = []
    for r in range(world):
        values = np.full((r + 1, 4), float(r + 1), dtype=np.float32)
        indices = np.arange(r + 1, dtype=np.int64) * 2
        dense.append(tf.convert_to_tensor(tf.IndexedSlices(values, indices, [9, 4])).numpy())
        if r == rank:
            mine = tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([9, 4], tf.int64))
    reduced = sdp.allreduce(mine, 0, 1)
    assert isinstance(reduced, tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(reduced).numpy(), np.mean(dense, 0), rtol=1e-6)
    gathered = sdp.allgather(tf.fill([rank + 1, 2], rank)).numpy()
    assert gathered.tolist() == [[r, r] for r in range(world) for _ in range(r + 1)]
    return 3


def check_gradient_of_allreduce(sdp, tf, rank, world) -> int:
    """Rank r's loss is (r + 1) * sum(allreduce(x)): the job's gradient reaches every x."""
    x = tf.Variable(np.full(3, float(rank), np.float32))
    cases = 0
    for op, scale in ((sdp.ReduceOp.SUM, 1.0), (sdp.ReduceOp.AVERAGE, 1.0 / world)):
        with tf.GradientTape() as tape:
            loss = (rank + 1) * tf.reduce_sum(sdp.allreduce(x, 0, 1, op=op))
        grad = tape.gradient(loss, x).numpy()
        want = scale * world * (world + 1) / 2
        np.testing.assert_allclose(grad, np.full(3, want, np.float32), rtol=1e-6)
        cases += 1
    return cases


def check_broadcast(sdp, tf, rank, world) -> int:
    cases = 0
    for root in range(world):
        for dtype in ("float64", "int32", "bool", "bfloat16"):
            data = np.random.default_rng((7, root)).standard_normal((3, 5)) > 0
            values = tf.cast(data, dtype) if rank == root else tf.zeros((3, 5), dtype)
            got = sdp.broadcast(values, root)
            assert got.dtype.name == dtype and np.array_equal(got.numpy(), tf.cast(data, dtype).numpy())
            cases += 1
    variables = [tf.Variable(np.full((4, 3), rank, np.float32)), tf.Variable(rank, dtype=tf.int64),
                 tf.Variable(np.arange(5, dtype=np.float16) * (rank + 1))]
    sdp.broadcast_variables(variables, root_rank=world - 1)
    assert np.array_equal(variables[0].numpy(), np.full((4, 3), world - 1, np.float32))
    assert int(variables[1].numpy()) == world - 1
    assert np.array_equal(variables[2].numpy(), np.arange(5, dtype=np.float16) * world)
    return cases + 1


def make_data(world):
    """Every rank's batches for every step: rank r's step-s batch is global rows (s, r)."""
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((STEPS, world, BATCH, 6)).astype(np.float32)
    y = (x @ rng.standard_normal((6, 2)).astype(np.float32)
         + 0.1 * rng.standard_normal((STEPS, world, BATCH, 2)).astype(np.float32))
    return x, y


def make_model(keras, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(2)])


def flat_weights(model):
    return np.concatenate([w.reshape(-1) for w in model.get_weights()])


def assert_ranks_agree(sdp, tf, vector, what):
    copies = sdp.allgather(tf.constant(vector[None, :])).numpy()
    assert (copies == copies[0]).all(), f"{what}: ranks differ"


def check_tape_training(sdp, tf, keras, rank, world) -> None:
    x, y = make_data(world)
    model = make_model(keras, seed=100 + rank)  # different replicas on purpose
    before = sdp.allgather(tf.constant(flat_weights(model)[None, :])).numpy()
    assert not (before == before[0]).all()
    sdp.broadcast_variables(model.variables, root_rank=0)
    assert_ranks_agree(sdp, tf, flat_weights(model), "after broadcast_variables")
    reference = make_model(keras, seed=0)
    reference.set_weights(model.get_weights())
    opt, ref_opt = keras.optimizers.SGD(0.05, momentum=0.9), keras.optimizers.SGD(0.05, momentum=0.9)
    mse = keras.losses.MeanSquaredError()

    @tf.function
    def step(inputs, targets):
        with tf.GradientTape() as tape:
            loss = mse(targets, model(inputs, training=True))
        tape = sdp.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def reference_step(inputs, targets):
        with tf.GradientTape() as tape:
            loss = mse(targets, reference(inputs, training=True))
        grads = tape.gradient(loss, reference.trainable_variables)
        ref_opt.apply_gradients(zip(grads, reference.trainable_variables))

    for s in range(STEPS):
        step(x[s, rank], y[s, rank])
        reference_step(x[s].reshape(world * BATCH, 6), y[s].reshape(world * BATCH, 2))
    mine = flat_weights(model)
    assert_ranks_agree(sdp, tf, mine, "after tape training")
    np.testing.assert_allclose(mine, flat_weights(reference), rtol=1e-4, atol=1e-5)
    assert not np.allclose(mine, before[0])  # it trained
    print(f"rank {rank}: tape training ok", flush=True)


def check_keras_fit(sdp, tf, keras, rank, world) -> None:
    x, y = make_data(world)
    model, reference = make_model(keras, seed=7), make_model(keras, seed=7)
    model.compile(optimizer=sdp.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    reference.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(x[:, rank].reshape(-1, 6), y[:, rank].reshape(-1, 2), batch_size=BATCH,
              epochs=1, shuffle=False, verbose=0)
    reference.fit(x.reshape(-1, 6), y.reshape(-1, 2), batch_size=BATCH * world,
                  epochs=1, shuffle=False, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == STEPS
    mine = flat_weights(model)
    assert_ranks_agree(sdp, tf, mine, "after model.fit")
    np.testing.assert_allclose(mine, flat_weights(reference), rtol=1e-4, atol=1e-5)
    print(f"rank {rank}: keras fit ok", flush=True)


def check_groups(sdp, tf, rank, world) -> int:
    """Collectives on groups: even and odd ranks (across hosts on 2 x 2), reversed order."""
    groups = [sdp.new_group([r for r in range(world) if r % 2 == parity]) for parity in (0, 1)]
    group = groups[rank % 2]
    members = [r for r in range(world) if r % 2 == rank % 2]
    total = sdp.oob_allreduce(tf.constant([float(rank), 1.0]), op=sdp.ReduceOp.SUM, group=group)
    assert total.numpy().tolist() == [float(sum(members)), float(len(members))], total
    root = len(members) - 1  # a rank of the group
    got = sdp.broadcast(tf.constant([rank, rank]), root_rank=root, group=group)
    assert got.numpy().tolist() == [members[root]] * 2, got
    rows = sdp.allgather(tf.fill([rank + 1, 2], rank), group=group).numpy()
    assert rows[:, 0].tolist() == [m for m in members for _ in range(m + 1)], rows
    backwards = sdp.new_group(list(reversed(range(world))))
    got = sdp.broadcast(tf.constant(rank), root_rank=0, group=backwards)
    assert int(got.numpy()) == world - 1
    for g in (group, backwards):  # the other parity's group is None here
        g.destroy()
    assert groups[1 - rank % 2] is None
    return 4


def worker() -> None:
    import keras
    import shoal.dataparallel.tensorflow as sdp
    import tensorflow as tf

    sdp.init()
    rank, world = sdp.rank(), sdp.size()
    cases = check_allreduce(sdp, tf, rank, world)
    cases += check_compression(sdp, tf, rank, world)
    cases += check_grouped_and_sparse(sdp, tf, rank, world)
    cases += check_broadcast(sdp, tf, rank, world)
    cases += check_gradient_of_allreduce(sdp, tf, rank, world)
    cases += check_groups(sdp, tf, rank, world)
    print(f"rank {rank}: local {sdp.local_rank()}/{sdp.local_size()} size {world}: "
          f"{cases} collectives ok", flush=True)
    check_tape_training(sdp, tf, keras, rank, world)
    check_keras_fit(sdp, tf, keras, rank, world)
    sdp.shutdown()


def bench(count: int = 200, elements: int = 1024, reps: int = 10, rounds: int = 5) -> None:
    """Not a test: one training step's gradient reduction, ms per step (best of ``rounds``).

    Shoal fused (``grouped_allreduce``: one packed buffer) against one op per tensor and
    against Open MPI's allreduce (mpi4py) of the same packed buffer inside the same graph.
    Run: ``mpirun --allow-run-as-root --oversubscribe -np 2 python <this file> bench [count [elements]]``.
    """
    import time

    import shoal.dataparallel.tensorflow as sdp
    import tensorflow as tf
    from mpi4py import MPI

    sdp.init()
    world = MPI.COMM_WORLD
    grads = [tf.constant(np.random.default_rng((i, sdp.rank())).standard_normal(elements), tf.float32)
             for i in range(count)]

    def mpi_average(flat):
        out = np.empty_like(flat)
        world.Allreduce(flat, out, op=MPI.SUM)
        return out / np.float32(world.Get_size())

    def open_mpi(gs):
        flat = tf.concat([tf.reshape(g, [-1]) for g in gs], 0)
        return tf.split(tf.numpy_function(mpi_average, [flat], tf.float32), len(gs))

    variants = {
        # The buckets of DistributedGradientTape's default bucket_cap_mb (25).
        "shoal fused": tf.function(lambda gs: sdp.grouped_allreduce(gs, bucket_bytes=25 << 20)),
        "shoal one op per tensor": tf.function(lambda gs: [sdp.allreduce(g, i, len(gs)) for i, g in enumerate(gs)]),
        "open mpi (mpi4py), packed": tf.function(open_mpi),
    }
    results = {}
    for name, step in variants.items():
        step(grads)
        best = float("inf")
        for _ in range(rounds):
            world.Barrier()
            start = time.perf_counter()
            for _ in range(reps):
                out = step(grads)
            _ = [o.numpy() for o in out]
            best = min(best, (time.perf_counter() - start) / reps)
        results[name] = best
    if sdp.rank() == 0:
        print(f"{count} x {elements} float32 gradients on {sdp.size()} ranks, ms per step:")
        shoal = results["shoal fused"]
        for name, seconds in results.items():
            print(f"  {name:28s} {seconds * 1e3:8.2f}  ({seconds / shoal:.2f}x shoal fused)", flush=True)
    sdp.shutdown()


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    worker()
elif __name__ == "__main__" and sys.argv[1:2] == ["bench"]:
    bench(*(int(a) for a in sys.argv[2:4]))  # bench [count [elements]]
