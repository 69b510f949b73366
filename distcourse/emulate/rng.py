"""A random-number generator per emulated GPU, seeded apart from the host's.

On a GPU box each device has its own generator (CUDA's Philox), which
`torch.manual_seed(s)` seeds too (torch/random.py: `manual_seed` seeds every
device, `_seed_custom_device` calls the device module's `manual_seed_all`); with the
same seed it draws other numbers than the host's Mersenne Twister, and its state is
not in `torch.get_rng_state()`. So here each emulated device index has its own
`torch.Generator`, seeded with `mixed(seed)`: the same seed gives the same device
numbers run after run and on every device index (as CUDA's generators, seeded alike,
agree), but not the host's numbers. A check that compares a device run with a CPU
reference drawn from the same seed, or a checkpoint that saves only the host's
state, fails here as it would on a GPU.

Device kernels that draw (ops tagged `nondeterministic_seeded`: randn, rand,
dropout, randperm, bernoulli ...) run on the host's kernels; `drawing(device)`
lends them the device's generator for the call: the host generator's state is set
aside and the device's put in its place, then both are put back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

DEFAULT_SEED = 67280421310721  # c10's default_rng_seed_val: CPU's and CUDA's default
_MIX = 0x9E3779B97F4A7C15  # any odd constant: the device's seed differs from the host's
_generators: dict[int, torch.Generator] = {}
_seeds: dict[int, int] = {}


def mixed(seed: int) -> int:
    """The seed a device generator is given for `torch.manual_seed(seed)`."""
    return ((seed ^ _MIX) * 0xBF58476D1CE4E5B9) % 2**63


def generator(index: int) -> torch.Generator:
    """The generator of emulated device `index` (made on first use)."""
    if index not in _generators:
        _generators[index] = torch.Generator().manual_seed(mixed(DEFAULT_SEED))
        _seeds[index] = DEFAULT_SEED
    return _generators[index]


def manual_seed(seed: int, index: int) -> None:
    """Seed device `index` (as `torch.cuda.manual_seed` seeds the current one)."""
    generator(index).manual_seed(mixed(int(seed)))
    _seeds[index] = int(seed)


def initial_seed(index: int) -> int:
    """The seed device `index` was last given (`torch.cuda.initial_seed`)."""
    generator(index)
    return _seeds[index]


def get_state(index: int) -> torch.Tensor:
    return generator(index).get_state()


def set_state(state: torch.Tensor, index: int) -> None:
    generator(index).set_state(state.cpu() if state.device.type != "cpu" else state)


@contextlib.contextmanager
def drawing(index: int) -> Iterator[None]:
    """Run host kernels with device `index`'s generator as the default one."""
    device_gen = generator(index)
    host = torch.default_generator.get_state()
    torch.default_generator.set_state(device_gen.get_state())
    try:
        yield
    finally:
        device_gen.set_state(torch.default_generator.get_state())
        torch.default_generator.set_state(host)
