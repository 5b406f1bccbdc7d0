"""``TorchEstimator``: fit a PyTorch model to a Spark DataFrame on hora ranks."""
import copy
import io
import sys
import time
import uuid

from pyspark.ml import Estimator

from hora.spark.common.store import LocalStore
from hora.spark.torch.columns import as_array_columns, check_columns
from hora.spark.torch.model import TorchModel


class TorchEstimator(Estimator):
    """Horovod's ``TorchEstimator`` on hora: ``fit(df)`` writes the feature
    and label columns to Parquet in ``store``, trains ``model`` with
    ``optimizer`` and ``loss`` on ``num_proc`` ranks (each reading its own
    shard, gradients averaged by ``DistributedOptimizer``) and returns a
    :class:`TorchModel`.

    ``feature_cols`` are passed to ``model(*features)`` in order, each as a
    float32 batch reshaped to ``input_shapes[i]`` when given (-1 for the
    batch); ``loss(output, label)`` gets the label column (integer columns
    as int64 class indices; others as float32, in the output's shape when
    they hold as many values as it, so a column of numbers meets a
    ``Linear(n, 1)`` output as (batch, 1), not (batch,); a list when there
    are several label columns, the i-th shaped like the i-th output). The
    optimizer travels to the ranks together with the model, parameter groups
    and state included.
    """

    def __init__(self, num_proc=None, model=None, optimizer=None, loss=None, feature_cols=None,
                 label_cols=None, batch_size=32, epochs=1, store=None, input_shapes=None,
                 shuffle=True, random_seed=0, run_id=None, verbose=1, output_cols=None):
        super().__init__()
        self.num_proc = num_proc
        self.model = model
        self.optimizer = optimizer
        self.loss = loss
        self.feature_cols = list(feature_cols or [])
        self.label_cols = list(label_cols or [])
        self.batch_size = batch_size
        self.epochs = epochs
        self.store = store
        self.input_shapes = input_shapes
        self.shuffle = shuffle
        self.random_seed = random_seed
        self.run_id = run_id
        self.verbose = verbose
        self.output_cols = output_cols

    def _check(self, df):
        import torch
        if not isinstance(self.model, torch.nn.Module):
            raise ValueError(f"TorchEstimator: model must be a torch.nn.Module, got "
                             f"{type(self.model).__name__}")
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise ValueError(f"TorchEstimator: optimizer must be a torch.optim.Optimizer, got "
                             f"{type(self.optimizer).__name__}")
        if not callable(self.loss):
            raise ValueError("TorchEstimator: loss must be callable as loss(output, label)")
        if not self.feature_cols or not self.label_cols:
            raise ValueError("TorchEstimator: feature_cols and label_cols are required")
        if not isinstance(self.store, LocalStore):
            raise ValueError("TorchEstimator: store must be a hora.spark.common.store.LocalStore")
        if self.input_shapes is not None and len(self.input_shapes) != len(self.feature_cols):
            raise ValueError(f"TorchEstimator: {len(self.input_shapes)} input_shapes for "
                             f"{len(self.feature_cols)} feature columns")
        if self.batch_size < 1 or self.epochs < 1:
            raise ValueError("TorchEstimator: batch_size and epochs must be at least 1")
        check_columns(df, self.feature_cols, "feature_cols")
        check_columns(df, self.label_cols, "label_cols")

    def _fit(self, df):
        import torch

        from hora.spark import run
        from hora.spark.torch.training import train
        self._check(df)
        sc = df.sparkSession.sparkContext
        num_proc = self.num_proc or sc.defaultParallelism
        run_id = self.run_id or f"torch-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        path = self.store.get_train_data_path(run_id)
        started = time.monotonic()
        columns = self.feature_cols + self.label_cols
        data = as_array_columns(df.select(*columns), columns)
        data.repartition(num_proc).write.mode("overwrite").parquet(self.store.spark_url(path))
        files = self.store.parquet_files(path)
        if self.verbose >= 1:
            print(f"TorchEstimator: wrote the DataFrame to {path} ({len(files)} Parquet files) "
                  f"in {time.monotonic() - started:.1f} s; training on {num_proc} ranks",
                  file=sys.stderr, flush=True)
        spec = {
            "model": self.model, "optimizer": self.optimizer, "loss": self.loss,
            "feature_cols": self.feature_cols, "label_cols": self.label_cols,
            "batch_size": self.batch_size, "epochs": self.epochs, "files": files,
            "input_shapes": self.input_shapes, "shuffle": self.shuffle,
            "seed": int(self.random_seed or 0), "verbose": self.verbose,
            "checkpoint_path": (self.store.get_checkpoint_path(run_id) if self.store.save_runs
                                else None),
        }
        results = run(train, args=(spec,), num_proc=num_proc, verbose=self.verbose)
        trained = copy.deepcopy(self.model)
        trained.load_state_dict(torch.load(io.BytesIO(results[0]["state"])))
        return TorchModel(model=trained, feature_cols=self.feature_cols,
                          label_cols=self.label_cols, input_shapes=self.input_shapes,
                          output_cols=self.output_cols, history=results[0]["history"],
                          run_id=run_id)
