"""python -m hora.bench tf-synthetic: its Keras models match the PyTorch
ones, and a tiny real run on two ranks (against MultiWorkerMirroredStrategy
and the tape variant) gives self-consistent JSON."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from hora.bench import keras_models  # noqa: E402


@pytest.mark.parametrize("name,parameters,gradients", [
    ("resnet20", 272_474, 65), ("resnet18", 11_689_512, 62),
    # PyTorch's 54 gradients, with attention's query, key and value apart
    ("transformer", 7_378_432, 70)])
def test_models_match_the_pytorch_ones(name, parameters, gradients):
    model = keras_models.build(keras, name)
    assert sum(int(np.prod(v.shape)) for v in model.trainable_weights) == parameters
    assert len(model.trainable_weights) == gradients
    x, y = keras_models.batch(name, 2, keras_models.default_image_size(name), seed=0)
    out = model(x)
    assert out.shape[0] == 2 and float(keras_models.loss(keras)(y, out)) > 0


def test_two_rank_run_against_mwms_and_the_tape(tmp_path):
    pytest.importorskip("tf_keras")
    out = tmp_path / "result.json"
    plot = tmp_path / "result.png"
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_", "TF_USE_LEGACY"))}
    job = subprocess.run(
        [sys.executable, "-m", "hora.runner", "-np", "2", sys.executable, "-m", "hora.bench",
         "tf-synthetic", "--batch-size", "2", "--image-size", "16", "--num-warmup-batches", "1",
         "--num-batches-per-iter", "2", "--num-iters", "2", "--compare", "mwms,hora_tape",
         "--json", str(out), "--plot", str(plot)],
        env=env, capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["ranks"], result["batch_size"], result["keras"]) == (2, 2, "2")
    variants = result["variants"]
    assert set(variants) == {"hora", "compute_only", "mwms", "hora_tape"}
    for stats in variants.values():
        assert len(stats["per_iteration"]) == 2 and stats["min"] <= stats["median"] <= stats["max"]
    per_iteration = [a / b for a, b in zip(variants["hora"]["per_iteration"],
                                           variants["mwms"]["per_iteration"])]
    assert result["ratios"]["hora/mwms"]["max"] == pytest.approx(max(per_iteration))
    # every synchronous variant ends with the same weights on both ranks
    assert result["parameter_spread"] == {"hora": 0.0, "mwms": 0.0, "hora_tape": 0.0}
    assert plot.stat().st_size > 1000
