"""Train a small PyTorch network on a Spark DataFrame of the digits data set
with hora's TorchEstimator, then add its predictions to the DataFrame.

    pip install 'hora[spark,torch,examples]'   # and Java 17 for Spark
    python examples/spark/train_digits_spark.py --num-proc 2

Spark runs in local mode here (--master local[N]); on a cluster, pass its
master URL and a --store directory that every executor can reach.
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import torch
from pyspark.sql import SparkSession
from sklearn.datasets import load_digits

from hora.spark.common.store import LocalStore
from hora.spark.torch import TorchEstimator


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--master", default=None, help="Spark master (default local[num-proc])")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--store", default=None, help="directory for the Parquet data and "
                        "checkpoints (default: a new temporary one)")
    args = parser.parse_args()
    # the executors' Python must be this one, where hora is installed
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(args.master or f"local[{args.num_proc}]")
             .appName("hora digits").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    digits = load_digits()
    rows = [((x / 16.0).tolist(), int(y)) for x, y in zip(digits.data, digits.target)]
    df = spark.createDataFrame(rows, ["features", "label"])
    train_df, test_df = df.randomSplit([0.8, 0.2], seed=0)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    estimator = TorchEstimator(
        num_proc=args.num_proc, model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05 * args.num_proc, momentum=0.9),
        loss=torch.nn.functional.cross_entropy, feature_cols=["features"],
        label_cols=["label"], batch_size=args.batch_size, epochs=args.epochs,
        store=LocalStore(args.store or tempfile.mkdtemp(prefix="hora-digits-")))
    trained = estimator.fit(train_df)

    predicted = trained.transform(test_df).toPandas()
    guesses = np.stack(predicted["label__output"].to_numpy()).argmax(axis=1)
    accuracy = float((guesses == predicted["label"].to_numpy()).mean())
    print(f"test accuracy: {accuracy:.3f} on {len(predicted)} rows "
          f"(final training loss {trained.getHistory()[-1]['loss']:.4f})")
    spark.stop()


if __name__ == "__main__":
    main()
