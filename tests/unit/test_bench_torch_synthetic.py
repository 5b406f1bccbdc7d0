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


def test_two_rank_run_reports_consistent_numbers(tmp_path):
    out = tmp_path / "result.json"
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))}
    job = subprocess.run(
        [sys.executable, "-m", "hora.runner", "-np", "2", sys.executable, "-m", "hora.bench",
         "torch-synthetic", "--batch-size", "4", "--num-warmup-batches", "1",
         "--num-batches-per-iter", "2", "--num-iters", "2", "--fp16-allreduce",
         "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "Scaling efficiency against 2 x one rank alone" in job.stdout
    result = json.loads(out.read_text())
    assert (result["ranks"], result["batch_size"], result["fp16_allreduce"]) == (2, 4, True)
    for variant in ("distributed", "compute_only"):
        per_rank = result[variant]["per_rank_img_sec"]
        assert len(per_rank) == 2 and all(rate > 0 for rate in per_rank)
        assert result[variant]["total_img_sec"] == pytest.approx(sum(per_rank))
    assert result["efficiency_vs_compute_only"] == pytest.approx(
        result["distributed"]["total_img_sec"] / result["compute_only"]["total_img_sec"])
    assert result["scaling_efficiency_vs_alone"] == pytest.approx(
        result["distributed"]["total_img_sec"] / (2 * result["alone_img_sec"]))
