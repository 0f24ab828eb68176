#!/usr/bin/python3
"""A convolutional network on Fashion-MNIST (a model the built-in MLP
cannot express), trained as a Strata worker: its parameters become the
job's dense tables on the pservers (the optimizer runs there), initialised
with the first worker's values; its data comes as tasks of record ranges
from the master. Copy it, change Net, and train your own model on the same
config (conf/torch-cnn.yaml declares no tables: the script's model does):

    scripts/launch.sh run --config conf/torch-cnn.yaml --hosts conf/hosts.local
"""


import torch
import torch.nn.functional as F

import strata.torch as st
from strata.data import read_idx_pair


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 5, padding=2)   # 28x28 -> pooled 14x14
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)  # 14x14 -> pooled 7x7
        self.fc1 = torch.nn.Linear(32 * 7 * 7, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.dropout(F.relu(self.fc1(x.flatten(1))), 0.25, self.training)
        return self.fc2(x)


def load(images, labels):
    x, y = read_idx_pair(images, labels)
    x = (x - 0.2860) / 0.3530  # Fashion-MNIST's mean and deviation: inputs near N(0, 1)
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)  # {n, 1, 28, 28}


def main():
    torch.set_num_threads(1)  # one core per worker; the pservers need theirs
    data = st.config()["data"]  # the job's config file (STRATA_CONFIG)
    x, y = load(data["train_images"], data["train_labels"])  # before joining: the job waits
    job = st.init()  # as the launcher says: STRATA_CONFIG, STRATA_MASTER, STRATA_INDEX
    torch.manual_seed(0)  # (only the first worker's initial values are used)
    model = job.distribute(Net())  # its parameters: the job's tables
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
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(tx[i:i + 1000]) for i in range(0, len(tx), 1000)])
        acc = float((out.argmax(1) == ty).float().mean())
        test_loss = float(loss_fn(out, ty))
    print("test accuracy %.4f" % acc, flush=True)
    job.finish(metrics={"test_accuracy": acc, "test_loss": test_loss, "test_examples": len(ty)})


if __name__ == "__main__":
    main()
