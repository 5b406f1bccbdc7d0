"""``TorchModel``: the Spark Transformer a ``TorchEstimator`` returns."""
from pyspark.ml import Model


class TorchModel(Model):
    """Adds the model's predictions to a DataFrame: ``transform(df)`` runs the
    trained model on ``feature_cols`` and adds one column per output,
    ``output_cols`` (default ``<label>__output``, as Horovod names them): a
    double for one value per row, an array of doubles otherwise."""

    def __init__(self, model=None, feature_cols=None, label_cols=None, input_shapes=None,
                 output_cols=None, history=None, run_id=None):
        super().__init__()
        self.model = model
        self.feature_cols = list(feature_cols or [])
        self.label_cols = list(label_cols or [])
        self.input_shapes = input_shapes
        self.output_cols = list(output_cols or [f"{name}__output" for name in self.label_cols])
        self.history = history or []
        self.run_id = run_id

    def getModel(self):  # noqa: N802 - Horovod's name
        """The trained ``torch.nn.Module``."""
        return self.model

    def getHistory(self):  # noqa: N802 - Horovod's name
        """One dict per epoch: ``epoch``, ``loss`` (mean over the ranks) and
        ``rows_per_s``."""
        return self.history

    def _predict_function(self, schema):
        """A pandas UDF: the feature columns in, a struct of the outputs out."""
        from pyspark.sql.functions import pandas_udf

        from hora.cluster import channel
        payload = channel.dumps((self.model, self.input_shapes, self.output_cols))

        def predict(*columns):
            import pandas as pd
            import torch

            from hora.spark.torch.columns import pandas_to_numpy, to_input
            model, shapes, outputs = channel.loads(payload)
            model.eval()
            rows = len(columns[0])
            shapes = shapes or [None] * len(columns)
            frame = pd.DataFrame(index=columns[0].index)
            if rows == 0:
                for name in outputs:
                    frame[name] = []
                return frame
            inputs = [to_input(pandas_to_numpy(column), shape)
                      for column, shape in zip(columns, shapes)]
            with torch.no_grad():
                result = model(*inputs)
            values = result if isinstance(result, (tuple, list)) else [result]
            for name, value in zip(outputs, values):
                array = value.detach().double().numpy().reshape(rows, -1)
                frame[name] = array[:, 0] if array.shape[1] == 1 else list(array)
            return frame
        return pandas_udf(predict, schema)

    def _output_types(self, sample):
        """Double or array-of-double per output, from one row's prediction."""
        import torch
        from pyspark.sql.types import ArrayType, DoubleType

        from hora.spark.torch.columns import pandas_to_numpy, to_input
        shapes = self.input_shapes or [None] * len(self.feature_cols)
        inputs = [to_input(pandas_to_numpy(sample[name]), shape)
                  for name, shape in zip(self.feature_cols, shapes)]
        self.model.eval()
        with torch.no_grad():
            result = self.model(*inputs)
        values = result if isinstance(result, (tuple, list)) else [result]
        return [DoubleType() if value.reshape(1, -1).shape[1] == 1 else ArrayType(DoubleType())
                for value in values]

    def _transform(self, df):
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql.functions import col
        from pyspark.sql.types import StructField, StructType
        # The model reads vectors as arrays; the DataFrame's own columns
        # come back as they were, with the outputs after them.
        inputs = [vector_to_array(df[name]) if isinstance(df.schema[name].dataType, VectorUDT)
                  else df[name] for name in self.feature_cols]
        sample = df.select(*[c.alias(name) for c, name in zip(inputs, self.feature_cols)]) \
            .limit(1).toPandas()
        if len(sample) == 0:
            raise ValueError("TorchModel.transform: the DataFrame is empty")
        types = self._output_types(sample)
        schema = StructType([StructField(name, kind)
                             for name, kind in zip(self.output_cols, types)])
        hidden = "__hora_outputs"
        with_outputs = df.withColumn(hidden, self._predict_function(schema)(*inputs))
        return with_outputs.select(*[col(f"`{name}`") for name in df.columns],
                                   *[col(f"`{hidden}`.`{name}`").alias(name)
                                     for name in self.output_cols])
