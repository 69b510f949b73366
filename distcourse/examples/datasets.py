"""Datasets that need no download: scikit-learn digits, labelled synthetic data."""

from __future__ import annotations

import os

import torch
from torch.utils.data import Dataset, TensorDataset


def digits(train: bool = True, test_fraction: float = 0.25) -> TensorDataset:
    """scikit-learn's 8x8 handwritten digits (1,797 images, shipped with the library).

    Pixels are scaled to [0, 1]; the train/test split is fixed, so every rank and every
    run sees the same split.
    """
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32) / 16.0  # pixels are 0..16
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    n_test = int(len(x) * test_fraction)
    part = order[n_test:] if train else order[:n_test]
    return TensorDataset(x[part], y[part])


def synthetic_regression(
    n: int, d_in: int = 10, d_out: int = 5, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and targets (x, y) for the toy model, reproducible from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=gen), torch.randn(n, d_out, generator=gen)


def cifar10_or_synthetic(
    root: str = "book/data", n: int = 512, train: bool = True
) -> tuple[Dataset, str]:
    """CIFAR-10 from `root` if it is on disk, else synthetic data of the same shape.

    Returns (dataset, description) so a chapter can say which one it used: nothing is
    downloaded, and synthetic data is labelled as such.
    """
    folder = os.path.join(root, "cifar-10-batches-py")
    if os.path.isdir(folder):
        from torchvision import datasets, transforms

        data = datasets.CIFAR10(root, train=train, transform=transforms.ToTensor())
        return data, "CIFAR-10 (from disk)"
    gen = torch.Generator().manual_seed(1 if train else 2)
    x = torch.rand(n, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (n,), generator=gen)
    return TensorDataset(x, y), f"synthetic, CIFAR-10-shaped ({n} images 3x32x32)"


def patterns(n: int = 512, size: int = 32, seed: int = 0) -> TensorDataset:
    """Synthetic images a CNN can learn: each class is one blurry colour pattern.

    Ten fixed patterns (random 4x4 colour grids, scaled up to size x size) and
    heavy noise on every image (the noise is as strong as the pattern), so the class
    must be read from the whole picture. A stand-in for CIFAR-10 (same shape, 10
    classes) when it is not on disk: unlike random labels, the loss can fall.
    """
    gen = torch.Generator().manual_seed(0)  # the same ten patterns in every split
    grids = torch.rand(10, 3, 4, 4, generator=gen) - 0.5
    templates = torch.nn.functional.interpolate(grids, size=size, mode="bilinear")
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=gen)
    noise = 0.3 * torch.randn(n, 3, size, size, generator=gen)
    return TensorDataset(0.5 + templates[y] + noise, y)


def cifar10_or_patterns(
    root: str = "book/data", n: int = 512, train: bool = True
) -> tuple[Dataset, str]:
    """CIFAR-10 from `root` if on disk, else `patterns` (learnable), labelled so."""
    if os.path.isdir(os.path.join(root, "cifar-10-batches-py")):
        return cifar10_or_synthetic(root, n, train)
    data = patterns(n, seed=1 if train else 2)
    return data, f"stand-in, not CIFAR-10: {n} synthetic images 3x32x32, 10 patterns"
