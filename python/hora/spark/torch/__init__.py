"""Training a PyTorch model on a Spark DataFrame with hora:
``TorchEstimator(...).fit(df)`` returns a ``TorchModel`` transformer."""
from hora.spark.torch.estimator import TorchEstimator
from hora.spark.torch.model import TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
