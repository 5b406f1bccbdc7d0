"""python -m hora.bench tf-synthetic: samples/sec of data-parallel Keras training.

Modelled on Horovod's tensorflow2_keras_synthetic_benchmark.py: a Keras
model trains on one fixed random batch per rank with hora's Keras
DistributedOptimizer; warm-up batches are discarded, then --num-iters
iterations of --num-batches-per-iter batches are timed.

Every iteration also times, in the same job and in alternating blocks whose
order rotates, the same model with no communication ("compute-only") and
each variant named by --compare: TensorFlow's MultiWorkerMirroredStrategy
(mwms), hora's DistributedGradientTape in a tf.function step (hora_tape),
Horovod (horovod). Each iteration's total samples/sec over all ranks is one
sample; the report gives medians, ranges and per-iteration ratios, as
torch-synthetic does.

Keras: TensorFlow 2.21 ships Keras 3, whose model.fit fails under
MultiWorkerMirroredStrategy (a PerReplica batch reaches its trainer
unconverted), so with mwms compared the benchmark uses Keras 2 (tf_keras,
TF_USE_LEGACY_KERAS=1) by default; --keras 3 measures the other variants
with Keras 3.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from types import SimpleNamespace

import numpy as np

from hora.bench import keras_models, synthetic

VARIANT_NAMES = ("mwms", "hora_tape", "horovod")


def build_parser():
    """The command line of ``python -m hora.bench tf-synthetic``."""
    parser = argparse.ArgumentParser(prog="python -m hora.bench tf-synthetic",
                                     description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    synthetic.add_model_options(parser, keras_models)
    parser.add_argument("--compare", default="mwms",
                        help="comma-separated variants trained in the same job besides hora and "
                             "compute-only: mwms (MultiWorkerMirroredStrategy), hora_tape "
                             "(DistributedGradientTape), horovod")
    parser.add_argument("--keras", choices=("auto", "2", "3"), default="auto",
                        help="Keras 2 (tf_keras) or Keras 3; auto: 2 when mwms is compared and "
                             "tf_keras is installed, else 3")
    synthetic.add_timing_options(parser)
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="hora and Horovod send gradients as float16 (Compression.fp16)")
    parser.add_argument("--threads", type=int, default=None,
                        help="TensorFlow threads per rank (default: the host's cores divided by "
                             "the ranks on it, at least 1)")
    synthetic.add_output_options(parser, "samples/sec")
    return parser


def parse(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    synthetic.check_counts(parser, args)
    args.compare = synthetic.parse_compare(parser, args.compare, VARIANT_NAMES)
    if args.keras == "auto":
        args.keras = "2" if "mwms" in args.compare and _has_tf_keras() else "3"
    if args.keras == "2" and not _has_tf_keras():
        parser.error("--keras 2 needs tf_keras (pip install tf_keras)")
    return args


def _has_tf_keras():
    import importlib.util
    return importlib.util.find_spec("tf_keras") is not None


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _multi_worker_strategy(hvd, tf):
    """Every rank a worker of a MultiWorkerMirroredStrategy on this host's
    loopback; made before any other TensorFlow work, as it must be."""
    ports = hvd.allgather_object(_free_port())
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
        "task": {"type": "worker", "index": hvd.rank()}})
    communication = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)


def run(args):
    if args.keras == "2":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"  # read when TensorFlow is imported
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from mpi4py import MPI

    import hora
    import hora.tensorflow.keras as hvd
    from hora.bench import tf_variants
    keras = __import__("tf_keras" if args.keras == "2" else "keras")

    hvd.init()
    comm = MPI.COMM_WORLD
    rank, size = hvd.rank(), hvd.size()
    cores = os.cpu_count() or 1
    threads = args.threads or max(1, cores // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)

    def log(message):
        if rank == 0:
            print(message, flush=True)

    strategy, strategy_reason = None, None
    if "mwms" in args.compare:
        if args.keras == "3":
            strategy_reason = ("MultiWorkerMirroredStrategy's model.fit fails with Keras 3 in "
                               "this TensorFlow; run with --keras 2")
        else:
            strategy = _multi_worker_strategy(hvd, tf)
    image_size = args.image_size or keras_models.default_image_size(args.model)
    keras.utils.set_random_seed(0)
    reference = keras_models.build(keras, args.model, image_size)
    setup = SimpleNamespace(
        args=args, keras=keras, model_name=args.model, image_size=image_size, size=size,
        initial_weights=reference.get_weights(),
        data=keras_models.batch(args.model, args.batch_size, image_size, 1000 + rank),
        optimizer=lambda: keras.optimizers.SGD(0.01 * size), strategy=strategy,
        strategy_reason=strategy_reason)
    variants = synthetic.usable_variants(
        [tf_variants.Hora(setup), tf_variants.ComputeOnly(setup)], tf_variants.KNOWN,
        args.compare, setup, log)

    parameters = sum(int(np.prod(v.shape)) for v in reference.trainable_weights)
    gradients = len(reference.trainable_weights)
    log(f"Model: {keras_models.DESCRIPTIONS[args.model]}"
        + (f"; {image_size}x{image_size} images" if image_size else ""))
    log(f"Gradients: {gradients} tensors, {parameters * 4 / 2**20:.1f} MiB of float32")
    log(f"Batch size: {args.batch_size} per rank; TensorFlow {tf.__version__}, Keras "
        f"{keras.__version__}")
    log(f"Ranks: {size}, {threads} TensorFlow thread(s) each; gradients sent as "
        f"{'float16' if args.fp16_allreduce else 'float32'}")
    log("Variants: " + "; ".join(f"{v.name} = {v.label}" for v in variants))

    everyone, alone, spreads = synthetic.measure_all(
        variants, lambda: tf_variants.ComputeOnly(setup), args, comm, log)
    if rank == 0:
        results = {"benchmark": "tf-synthetic", "model": args.model, "parameters": parameters,
                   "gradients": gradients, "image_size": image_size,
                   "batch_size": args.batch_size, "ranks": size, "threads_per_rank": threads,
                   "host_cores": cores, "keras": args.keras, "keras_version": keras.__version__,
                   "tensorflow_version": tf.__version__, "hora_version": hora.__version__,
                   "fp16_allreduce": args.fp16_allreduce,
                   "num_warmup_batches": args.num_warmup_batches,
                   "num_batches_per_iter": args.num_batches_per_iter,
                   "num_iters": args.num_iters}
        pairs = [("hora", "compute_only"), ("hora", "mwms"), ("hora", "horovod"),
                 ("hora", "hora_tape"), ("hora_tape", "compute_only"), ("mwms", "compute_only")]
        unit = "samples/sec" if args.model == "transformer" else "img/sec"
        synthetic.report(results, everyone, alone, spreads, pairs, unit)
        synthetic.write(results, args, f"Keras {args.keras} {args.model}, batch "
                                       f"{args.batch_size}/rank, {size} ranks", "mwms", unit)
    hvd.shutdown()
    return 0


def main(argv=None):
    return run(parse(argv))
