#!/usr/bin/python3
"""The DLRM example's model (examples/torch/ctr_dlrm.py) trained by one
PyTorch process alone, the baseline of bench/dlrm_bench.sh: the same
bottom and top MLPs (Adam, as conf/torch-dlrm.yaml's optimizer), and the
categorical values' rows in one nn.EmbeddingBag with sparse gradients
(Adagrad, as its sparse.optimizer), on the same CTR file, batch 256, on
`--threads` threads. Prints one JSON line: samples/s over the training
loop (the data read before it), the test AUC.

    /usr/bin/python3 bench/dlrm_alone.py --train F --test F [--epochs 3] [--threads 2]
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "build", "python"))
sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))
from ctr_dlrm import Dlrm  # noqa: E402
from strata.data import CTR_FIELDS, read_criteo  # noqa: E402
from strata.metrics import auc  # noqa: E402


class Rows(torch.nn.Module):
    """Each (field, value) key's row: an EmbeddingBag of bags of one."""

    def __init__(self, vocab, dim):
        super().__init__()
        self.dim = dim
        self.bag = torch.nn.EmbeddingBag(vocab, dim, mode="sum", sparse=True)
        torch.nn.init.normal_(self.bag.weight, std=0.01)  # sparse.init normal 0.01

    def forward(self, idx):
        flat = idx.reshape(-1)
        return self.bag(flat, torch.arange(flat.numel())).view(idx.shape[0], CTR_FIELDS, self.dim)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(7)
    dense, keys, labels = read_criteo(args.train)
    tdense, tkeys, tlabels = read_criteo(args.test)
    vocab, inverse = np.unique(np.concatenate([keys.reshape(-1), tkeys.reshape(-1)]),
                               return_inverse=True)
    idx = torch.from_numpy(inverse[:keys.size].reshape(keys.shape).astype(np.int64))
    tidx = torch.from_numpy(inverse[keys.size:].reshape(tkeys.shape).astype(np.int64))
    dense, labels = torch.from_numpy(dense), torch.from_numpy(labels)
    model = Dlrm(Rows(len(vocab), 8))
    rows = list(model.embedding.parameters())
    others = [p for n, p in model.named_parameters() if not n.startswith("embedding.")]
    opt_dense = torch.optim.Adam(others, lr=0.001)
    opt_rows = torch.optim.Adagrad(rows, lr=0.05, initial_accumulator_value=0.1)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    n = len(labels)
    start = time.perf_counter()
    for _ in range(args.epochs):
        perm = torch.randperm(n)
        for b in range(0, n, args.batch):
            i = perm[b:b + args.batch]
            opt_dense.zero_grad()
            opt_rows.zero_grad()
            loss_fn(model(dense[i], idx[i]), labels[i]).backward()
            opt_dense.step()
            opt_rows.step()
    secs = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(torch.from_numpy(tdense[b:b + 4096]), tidx[b:b + 4096])
                            for b in range(0, len(tlabels), 4096)])
    print(json.dumps({"threads": args.threads, "epochs": args.epochs, "samples": n * args.epochs,
                      "seconds": secs, "samples_per_sec": n * args.epochs / secs,
                      "test_auc": auc(logits.numpy(), tlabels)}))


if __name__ == "__main__":
    main()
