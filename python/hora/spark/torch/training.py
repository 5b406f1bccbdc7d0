"""What every rank runs for ``TorchEstimator.fit``: read this rank's shard of
the Parquet data with pyarrow, train with hora's DistributedOptimizer, and
print progress from rank 0 (it reaches the driver through the job's output)."""
import io
import time

import numpy as np


def _read_shard(files, columns, rank, size):
    """This rank's rows: whole files when there are enough to go round,
    otherwise every size-th row of all of them."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    if len(files) >= size:
        tables = [pq.read_table(path, columns=columns) for path in files[rank::size]]
        return pa.concat_tables(tables) if tables else None
    table = pa.concat_tables([pq.read_table(path, columns=columns) for path in files])
    return table.take(np.arange(rank, table.num_rows, size))


def train(spec):
    import torch

    import hora.torch as hvd
    from hora.spark.torch.columns import arrow_to_numpy, shaped_like, to_input, to_label
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(spec["seed"])
    # model and optimizer were pickled together, so the optimizer's
    # parameter groups still hold this model's parameters
    model, optimizer = spec["model"], spec["optimizer"]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    feature_cols, label_cols = spec["feature_cols"], spec["label_cols"]
    table = _read_shard(spec["files"], feature_cols + label_cols, rank, size)
    rows = 0 if table is None else table.num_rows
    features = [arrow_to_numpy(table.column(c)) for c in feature_cols] if rows else []
    labels = [arrow_to_numpy(table.column(c)) for c in label_cols] if rows else []
    batch_size = spec["batch_size"]
    # every rank must take the same number of steps, or the allreduces of
    # the last ones would wait for ever
    steps = int(hvd.allreduce(torch.tensor(rows // batch_size), op=hvd.Min,
                              name="hora.estimator.steps"))
    if steps == 0:
        raise ValueError(f"rank {rank} has {rows} rows, fewer than batch_size={batch_size}: "
                         f"use a smaller batch or fewer processes")
    shapes = spec["input_shapes"] or [None] * len(feature_cols)
    loss_fn = spec["loss"]
    rng = np.random.default_rng(spec["seed"] + rank)
    history = []
    for epoch in range(spec["epochs"]):
        model.train()
        order = rng.permutation(rows) if spec["shuffle"] else np.arange(rows)
        started = time.perf_counter()
        total = 0.0
        for step in range(steps):
            index = order[step * batch_size:(step + 1) * batch_size]
            inputs = [to_input(f[index], shape) for f, shape in zip(features, shapes)]
            targets = [to_label(values[index]) for values in labels]
            optimizer.zero_grad()
            output = model(*inputs)
            outputs = output if isinstance(output, (tuple, list)) else [output]
            targets = [shaped_like(t, o) for t, o in zip(targets, outputs)] + \
                targets[len(outputs):]
            loss = loss_fn(output, targets[0] if len(targets) == 1 else targets)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
        seconds = time.perf_counter() - started
        mean_loss = float(hvd.allreduce(torch.tensor(total / steps), name="hora.estimator.loss"))
        rows_per_s = steps * batch_size * size / seconds
        history.append({"epoch": epoch + 1, "loss": mean_loss, "rows_per_s": rows_per_s})
        if rank == 0 and spec["verbose"] >= 1:
            print(f"epoch {epoch + 1}/{spec['epochs']}: loss {mean_loss:.4f}, "
                  f"{rows_per_s:.0f} rows/s", flush=True)
    # the replicas must agree; a difference would mean lost updates
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    sums = hvd.allgather_object(checksum)
    if max(sums) - min(sums) > 1e-6 * max(1.0, abs(sums[0])):
        raise RuntimeError(f"the ranks ended with different parameters (sums {sums})")
    if rank != 0:
        return None
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    if spec["checkpoint_path"]:
        import os
        os.makedirs(os.path.dirname(spec["checkpoint_path"]), exist_ok=True)
        with open(spec["checkpoint_path"], "wb") as f:
            f.write(buffer.getvalue())
    return {"state": buffer.getvalue(), "history": history}
