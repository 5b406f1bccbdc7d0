"""python -m hora.bench torch-synthetic: its models, and a tiny real run on
two ranks whose JSON must be self-consistent."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from hora.bench import small_resnet  # noqa: E402


@pytest.mark.parametrize("name,parameters", [
    ("resnet20", 272_474),       # He et al.'s CIFAR-10 ResNet-20 (0.27 M)
    ("resnet18", 11_689_512),    # torchvision's resnet18()
])
def test_models_have_the_published_sizes(name, parameters):
    model = small_resnet.build(name)
    assert sum(p.numel() for p in model.parameters()) == parameters
    size = small_resnet.default_image_size(name)
    out = model(torch.randn(2, 3, size, size))
    assert out.shape == (2, small_resnet.num_classes(name))


def test_norm_layer_is_called_with_channel_counts():
    channels = []

    def norm(count):
        channels.append(count)
        return torch.nn.BatchNorm2d(count)

    small_resnet.build("resnet20", norm)
    # stem, 9 blocks of two, and the two shortcuts that change the width
    assert len(channels) == 1 + 9 * 2 + 2
    assert sorted(set(channels)) == [16, 32, 64]


def test_transformer_has_many_small_and_two_large_gradients():
    from hora.bench import train_models
    model = train_models.build("transformer")
    sizes = sorted(p.numel() for p in model.parameters())
    assert len(sizes) == 54 and sum(sizes) == 7_378_432
    assert sizes[-2:] == [8192 * 256, 8192 * 256]  # embedding and output projection
    tokens, target = train_models.batch("transformer", 2, None, torch.Generator().manual_seed(0))
    assert train_models.loss(model(tokens), target).item() > 0


def test_two_rank_run_reports_consistent_numbers(tmp_path):
    out = tmp_path / "result.json"
    plot = tmp_path / "result.png"
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))}
    job = subprocess.run(
        [sys.executable, "-m", "hora.runner", "-np", "2", sys.executable, "-m", "hora.bench",
         "torch-synthetic", "--batch-size", "4", "--num-warmup-batches", "1",
         "--num-batches-per-iter", "2", "--num-iters", "3", "--fp16-allreduce",
         "--compare", "ddp,hora_per_gradient", "--json", str(out), "--plot", str(plot)],
        env=env, capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "hora's scaling efficiency against 2 x that" in job.stdout
    result = json.loads(out.read_text())
    assert (result["ranks"], result["batch_size"], result["fp16_allreduce"]) == (2, 4, True)
    variants = result["variants"]
    assert set(variants) == {"hora", "compute_only", "ddp", "hora_per_gradient"}
    for stats in variants.values():
        assert len(stats["per_rank_median"]) == 2 and all(r > 0 for r in stats["per_rank_median"])
        assert len(stats["per_iteration"]) == 3
        assert stats["min"] <= stats["median"] <= stats["max"]
    ratio = result["ratios"]["hora/ddp"]
    per_iteration = [a / b for a, b in zip(variants["hora"]["per_iteration"],
                                           variants["ddp"]["per_iteration"])]
    assert ratio["min"] == pytest.approx(min(per_iteration))
    assert ratio["max"] == pytest.approx(max(per_iteration))
    assert result["scaling_vs_alone"] == pytest.approx(
        variants["hora"]["median"] / (2 * result["alone"]["median"]))
    # every synchronous variant ends with the same weights on both ranks
    assert result["parameter_spread"] == {"hora": 0.0, "ddp": 0.0, "hora_per_gradient": 0.0}
    assert plot.stat().st_size > 1000
