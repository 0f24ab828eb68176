#!/usr/bin/python3
"""The README's MLP (conf/local.yaml: Fashion-MNIST, layers 784-256-128-10,
ReLU) written in PyTorch, trained as a Strata worker: its parameters live
on the job's pservers (the optimizer runs there, as the config says), its
data comes as tasks of record ranges from the master.

Started by the launcher as a worker (STRATA_CONFIG, STRATA_MASTER and
STRATA_INDEX set), or by hand against a running cluster:
    STRATA_CONFIG=conf/torch.yaml STRATA_MASTER=127.0.0.1:7070 STRATA_INDEX=0 \
        PYTHONPATH=build/python /usr/bin/python3 examples/torch/fmnist_mlp.py
"""

import torch

import strata.torch as st
from strata.data import read_idx_pair


def load(images, labels):
    x, y = read_idx_pair(images, labels)
    return torch.from_numpy(x.reshape(len(x), -1)), torch.from_numpy(y)


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
    torch.set_num_threads(1)
    config = st.config()  # the job's config file (STRATA_CONFIG)
    data = config["data"]
    x, y = load(data["train_images"], data["train_labels"])  # before joining: the job waits
    job = st.init()  # as the launcher says: STRATA_CONFIG, STRATA_MASTER, STRATA_INDEX
    model = job.distribute(Mlp(config["model"]["layers"]))
    loss_fn = torch.nn.CrossEntropyLoss()
    for records in job.tasks():
        batch = job.batch_size  # this task's (it changes when the job scales)
        for b in range(0, len(records), batch):
            idx = records[b:b + batch]
            out = model(x[idx])
            loss = loss_fn(out, y[idx])
            job.backward(loss, len(idx))  # loss.backward(), each gradient pushed as it comes
            correct = int((out.argmax(1) == y[idx]).sum())
            job.step(len(idx), loss=loss.item(), correct=correct)
    if not job.evaluating:  # another worker gives the final test figures
        job.finish()
        return
    tx, ty = load(data["test_images"], data["test_labels"])
    with torch.no_grad():
        out = model(tx)
        acc = float((out.argmax(1) == ty).float().mean())
        test_loss = float(loss_fn(out, ty))
    print("test accuracy %.4f" % acc, flush=True)
    job.finish(metrics={"test_accuracy": acc, "test_loss": test_loss, "test_examples": len(ty)})


if __name__ == "__main__":
    main()
