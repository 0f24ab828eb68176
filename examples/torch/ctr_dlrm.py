#!/usr/bin/python3
"""A DLRM-style click-through-rate model on the CTR data of conf/ctr.yaml,
trained as a Strata worker: each categorical field's value is looked up
in a Strata sparse table (job.embedding: rows pulled from the pservers,
their gradients pushed back, the row optimizer of sparse.optimizer run
there), the 13 dense features go through a bottom MLP, and a top MLP reads
the 27 vectors and their pairwise dot products. The dense layers are the
config's dense tables (model.tables), trained on the pservers too.

    scripts/launch.sh run --config conf/torch-dlrm.yaml --hosts conf/hosts.local
"""


import torch

import strata.torch as st
from strata.data import CTR_DENSE, CTR_FIELDS, read_criteo
from strata.metrics import auc


class Dlrm(torch.nn.Module):
    def __init__(self, embedding, bottom=(32,), top=(64,)):
        super().__init__()
        dim = embedding.dim
        self.embedding = embedding  # a Strata sparse table: not a parameter
        widths = [CTR_DENSE, *bottom, dim]
        self.bottom = torch.nn.Sequential(*[
            m for a, b in zip(widths, widths[1:]) for m in (torch.nn.Linear(a, b), torch.nn.ReLU())])
        vectors = CTR_FIELDS + 1
        widths = [vectors * dim + vectors * (vectors - 1) // 2, *top]
        layers = [m for a, b in zip(widths, widths[1:]) for m in (torch.nn.Linear(a, b),
                                                                   torch.nn.ReLU())]
        self.top = torch.nn.Sequential(*layers, torch.nn.Linear(widths[-1], 1))
        self.pairs = torch.triu_indices(vectors, vectors, 1)

    def forward(self, dense, keys):
        b = self.bottom(dense)                           # {B, dim}
        e = self.embedding(keys)                         # {B, 26, dim}
        z = torch.cat([b.unsqueeze(1), e], 1)            # {B, 27, dim}
        dots = torch.bmm(z, z.transpose(1, 2))           # {B, 27, 27}
        x = torch.cat([z.flatten(1), dots[:, self.pairs[0], self.pairs[1]]], 1)
        return self.top(x).squeeze(1)                    # logits {B}


def main():
    torch.set_num_threads(1)
    data = st.config()["data"]  # the job's config file (STRATA_CONFIG)
    # Read before joining: the job waits for its workers.
    dense, keys, labels = (torch.from_numpy(a) for a in read_criteo(data["train"]))
    job = st.init()  # as the launcher says: STRATA_CONFIG, STRATA_MASTER, STRATA_INDEX
    model = job.distribute(Dlrm(job.embedding("embedding")))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for records in job.tasks():
        batch = job.batch_size  # this task's (it changes when the job scales)
        for b in range(0, len(records), batch):
            idx = records[b:b + batch]
            logits = model(dense[idx], keys[idx])
            loss = loss_fn(logits, labels[idx])
            loss.backward()
            correct = int(((logits > 0).float() == labels[idx]).sum())
            job.step(len(idx), loss=loss.item(), correct=correct)
    if not job.evaluating:  # another worker gives the final test figures
        job.finish()
        return
    tdense, tkeys, tlabels = (torch.from_numpy(a) for a in read_criteo(data["test"]))
    with torch.no_grad():
        logits = torch.cat([model(tdense[i:i + 4096], tkeys[i:i + 4096])
                            for i in range(0, len(tlabels), 4096)])
        test_loss = float(loss_fn(logits, tlabels))
        acc = float(((logits > 0).float() == tlabels).float().mean())
    test_auc = auc(logits.numpy(), tlabels.numpy())
    print("test AUC %.4f, log-loss %.4f" % (test_auc, test_loss), flush=True)
    job.finish(metrics={"test_auc": test_auc, "test_loss": test_loss, "test_accuracy": acc,
                        "test_examples": len(tlabels)})


if __name__ == "__main__":
    main()
