#!/usr/bin/python3
"""The README's MLP (conf/local.yaml: Fashion-MNIST, layers 784-256-128-10,
ReLU) written in PyTorch, trained as a Strata worker: its parameters live
on the job's pservers (the optimizer runs there, as the config says), its
data comes as tasks of record ranges from the master.

Started by the launcher as a worker (STRATA_CONFIG, STRATA_MASTER and
STRATA_INDEX set), or by hand:
    PYTHONPATH=build/python /usr/bin/python3 examples/torch/fmnist_mlp.py \
        --config conf/local.yaml --master 127.0.0.1:7070 --index 0
"""

import argparse
import gzip
import struct

import numpy as np
import torch
import yaml

import strata.torch as st


def read_idx(path):
    """An IDX file (gzip or not) as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, dims = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError("%s: not an unsigned-byte IDX file" % path)
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(images, labels):
    x = read_idx(images).reshape(-1, 28 * 28).astype(np.float32) / 255.0
    y = read_idx(labels).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


class Mlp(torch.nn.Module):
    """Strata's MLP layout: per layer a weight {in, out} (y = x W + b) and a
    bias {out}, the tables of model.layers in order."""

    def __init__(self, layers):
        super().__init__()
        self.weights = torch.nn.ParameterList()
        self.biases = torch.nn.ParameterList()
        for i in range(len(layers) - 1):
            self.weights.append(torch.nn.Parameter(torch.zeros(layers[i], layers[i + 1])))
            self.biases.append(torch.nn.Parameter(torch.zeros(layers[i + 1])))

    def named_parameters(self, *args, **kwargs):  # the tables' order: fc0.weight, fc0.bias, ...
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            yield "fc%d.weight" % i, w
            yield "fc%d.bias" % i, b

    def forward(self, x):
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = x @ w + b
            if i + 1 < len(self.weights):
                x = torch.relu(x)
        return x


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config")
    ap.add_argument("--master")
    ap.add_argument("--index", type=int)
    args = ap.parse_args()
    torch.set_num_threads(1)
    job = st.init(config=args.config, master=args.master, index=args.index)
    with open(args.config or __import__("os").environ["STRATA_CONFIG"]) as f:
        config = yaml.safe_load(f)
    data = config["data"]
    batch = config["job"]["batch_size"]
    x, y = load(data["train_images"], data["train_labels"])
    model = job.distribute(Mlp(config["model"]["layers"]))
    loss_fn = torch.nn.CrossEntropyLoss()
    for records in job.tasks():
        for b in range(0, len(records), batch):
            idx = records[b:b + batch]
            out = model(x[idx])
            loss = loss_fn(out, y[idx])
            loss.backward()
            correct = int((out.argmax(1) == y[idx]).sum())
            job.step(len(idx), loss=loss.item(), correct=correct)
    tx, ty = load(data["test_images"], data["test_labels"])
    with torch.no_grad():
        out = model(tx)
        acc = float((out.argmax(1) == ty).float().mean())
        test_loss = float(loss_fn(out, ty))
    print("test accuracy %.4f" % acc, flush=True)
    job.finish(metrics={"test_accuracy": acc, "test_loss": test_loss})


if __name__ == "__main__":
    main()
