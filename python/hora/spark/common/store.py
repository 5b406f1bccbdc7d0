"""Where an estimator keeps the Parquet copy of its training data, and the
checkpoints of its runs."""
import os
import shutil


class LocalStore:
    """A directory on a file system that the driver and every executor see
    (this machine's disk in local mode, or a shared mount):

    - ``<prefix>/intermediate_train_data``: the DataFrame as Parquet,
    - ``<prefix>/runs/<run_id>/checkpoint.pt``: the trained model.

    A ``file://`` prefix is accepted.
    """

    def __init__(self, prefix_path, train_path=None, runs_path=None, save_runs=True):
        if prefix_path.startswith("file://"):
            prefix_path = prefix_path[len("file://"):]
        self.prefix_path = os.path.abspath(prefix_path)
        self._train_path = train_path or os.path.join(self.prefix_path,
                                                      "intermediate_train_data")
        self._runs_path = runs_path or os.path.join(self.prefix_path, "runs")
        self.save_runs = save_runs

    def get_train_data_path(self, idx=None):
        """Where fit() writes the training data (``.idx`` appended if given)."""
        return self._train_path if idx is None else f"{self._train_path}.{idx}"

    def get_runs_path(self):
        """The directory holding one directory per run."""
        return self._runs_path

    def get_run_path(self, run_id):
        """The directory of one run."""
        return os.path.join(self._runs_path, run_id)

    def get_checkpoint_path(self, run_id):
        """The trained model's state dict, as ``torch.save`` wrote it."""
        return os.path.join(self.get_run_path(run_id), "checkpoint.pt")

    def exists(self, path):
        """Whether ``path`` exists in the store."""
        return os.path.exists(path)

    def remove(self, path):
        """Delete a file or a whole directory of the store."""
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)

    def spark_url(self, path):
        """The path in the form Spark's readers and writers take."""
        return "file://" + path

    def parquet_files(self, path):
        """The data files of a Parquet directory Spark wrote, in order."""
        return sorted(os.path.join(path, name) for name in os.listdir(path)
                      if name.endswith(".parquet"))

    def __repr__(self):
        return f"LocalStore({self.prefix_path!r})"
