#!/usr/bin/python3
"""The README's MLP (Fashion-MNIST, layers 784-256-128-10, ReLU) as an
nn.Sequential, trained in model.stages pipeline stages across workers
(docs/python.md, "Pipeline stages"): worker index i holds stage i % K of
the layers, the first stage's worker takes the data tasks and sends each
batch through the stages in micro-batches (one-forward-one-backward), and
each stage pushes its own layers' gradient to the pservers, where their
optimizer runs.

    scripts/launch.sh run --config conf/torch-pipeline.yaml --hosts conf/hosts.local
"""

from collections import OrderedDict

import torch

import strata.torch as st
from strata.data import read_idx_pair


def load(images, labels):
    x, y = read_idx_pair(images, labels)
    return torch.from_numpy(x.reshape(len(x), -1)), torch.from_numpy(y)


class Dense(torch.nn.Module):
    """y = x W + b with W {in, out}: Strata's MLP tables (model.type mlp
    names them fcI.weight and fcI.bias)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n_in, n_out))
        self.bias = torch.nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


def sequential(layers):
    """fc0, act0, fc1, act1, ..., fcL: the ReLU after every layer but the
    last, as model.activation relu."""
    mods = OrderedDict()
    for i in range(len(layers) - 1):
        mods["fc%d" % i] = Dense(layers[i], layers[i + 1])
        if i + 2 < len(layers):
            mods["act%d" % i] = torch.nn.ReLU()
    return torch.nn.Sequential(mods)


def main():
    torch.set_num_threads(1)
    config = st.config()
    data = config["data"]
    layers = config["model"]["layers"]
    x, y = load(data["train_images"], data["train_labels"])
    job = st.init()
    model = sequential(layers)
    pipe = job.pipeline(model, loss=torch.nn.functional.cross_entropy, input_shape=(layers[0],))
    print("pipeline stage %d of %d" % (pipe.stage, pipe.stages), flush=True)
    for records in job.tasks():  # the first stage's worker only: the others follow in it
        batch = job.batch_size
        for b in range(0, len(records), batch):
            idx = records[b:b + batch]
            pipe.step(x[idx], y[idx])
    if not job.evaluating:  # another worker gives the final test figures
        job.finish()
        return
    tx, ty = load(data["test_images"], data["test_labels"])
    with torch.no_grad():  # (every table pulled into this worker's model)
        out = model(tx)
        acc = float((out.argmax(1) == ty).float().mean())
        test_loss = float(torch.nn.functional.cross_entropy(out, ty))
    print("test accuracy %.4f" % acc, flush=True)
    job.finish(metrics={"test_accuracy": acc, "test_loss": test_loss, "test_examples": len(ty)})


if __name__ == "__main__":
    main()
