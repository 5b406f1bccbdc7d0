"""The data both TensorFlow examples train on: scikit-learn's bundled 8x8
handwritten digits (1797 images, nothing to download), split 80/20 the same
way on every rank."""

import numpy as np


def load_digits_dataset():
    """(train_x, train_y, test_x, test_y): images (N, 8, 8, 1) in [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("this example needs scikit-learn: pip install scikit-learn") from None
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(42).permutation(len(labels))
    images, labels = images[order], labels[order]
    cut = int(0.8 * len(labels))
    return images[:cut], labels[:cut], images[cut:], labels[cut:]
