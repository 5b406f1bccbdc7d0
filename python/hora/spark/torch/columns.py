"""Turning DataFrame columns into arrays and tensors, on the driver (Spark
side) and in the ranks (pyarrow side)."""
import numpy as np


def as_array_columns(df, columns):
    """``df`` with every ML vector among ``columns`` turned into an array
    column (Parquet and pandas have no vector type)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    for name in columns:
        if isinstance(df.schema[name].dataType, VectorUDT):
            df = df.withColumn(name, vector_to_array(df[name]))
    return df


def check_columns(df, columns, what):
    missing = [name for name in columns if name not in df.columns]
    if missing:
        raise ValueError(f"{what} {missing} are not columns of the DataFrame "
                         f"(its columns: {df.columns})")


def arrow_to_numpy(column):
    """A pyarrow column of scalars or of equal-length lists as a NumPy array
    of shape (rows,) or (rows, length)."""
    import pyarrow as pa
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        rows = len(column)
        values = column.flatten().to_numpy(zero_copy_only=False)
        return values.reshape(rows, -1) if rows else values.reshape(0, 0)
    return column.to_numpy(zero_copy_only=False)


def pandas_to_numpy(series):
    values = series.to_numpy()
    if len(values) and isinstance(values[0], (list, tuple, np.ndarray)):
        return np.stack([np.asarray(v) for v in values])
    return values


def to_input(values, shape=None):
    """A float32 tensor from NumPy values, reshaped to ``shape`` (with -1 for
    the batch) if given."""
    import torch
    tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    return tensor.reshape(shape) if shape is not None else tensor


def shaped_like(label, output):
    """A float label with as many values as the model's output, in the
    output's shape: a label column of shape (batch,) against an output of
    (batch, 1) would otherwise broadcast to (batch, batch) inside the loss.
    Class indices (integer labels) and labels of another size are left as
    they are."""
    if (label.is_floating_point() and hasattr(output, "shape")
            and label.shape != output.shape and label.numel() == output.numel()):
        return label.reshape(output.shape)
    return label


def to_label(values):
    """Integer labels stay integers (class indices); others become float32."""
    import torch
    if np.issubdtype(values.dtype, np.integer):
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
