"""What the chapters train: small models, datasets that need no download, train loops.

Nothing here knows about ranks or process groups; strategies take these as plain
`nn.Module`s and datasets.
"""
