"""Strata: a parameter server for training large models (docs/python.md).

``strata.torch`` makes a PyTorch training script a Strata worker: its
model's parameters live on the pservers, its data comes as tasks leased from
the master, and the optimizer runs server-side as the job's config says.
"""
