"""strata.torch with the script's own tables (model.type script): sparse
tables through job.embedding, dense tables matched by name, and the
examples in examples/torch/, against real master and pserver processes
(tests/python/conftest.py)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="python3-torch not installed (install-deps.sh --test)")
import strata.torch as st  # noqa: E402

from conftest import BIN, FMNIST, ROOT  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir(FMNIST),
                                reason="dataset-fashion-mnist not installed")

DIM = 3
LR = 0.5
SCRIPT_MODEL = """model:
  type: script
  tables:
    - {name: w, shape: [%d]}
    - {name: item, dim: %d}""" % (DIM, DIM)
# Plain sgd on the rows, so a step's change of a row is -lr * its summed
# gradient; rows start at normal(0, 0.5) values.
SPARSE = """sparse:
  partitions: 4
  init: {type: normal, scale: 0.5}
  optimizer: {type: sgd, learning_rate: %g}
worker:
  command: [/usr/bin/python3, unused.py]
""" % LR


def script_cluster(factory, **kw):
    return factory(model=SCRIPT_MODEL, extra=SPARSE, steps_records=640, **kw)


class WithW(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(DIM))


def loss_of(rows, w):
    """A non-linear loss of the looked-up rows {B, 2, DIM}: the mean over
    the batch, as a script's loss is."""
    return (torch.sin(rows) * w).sum(dim=(1, 2)).pow(2).mean()


def test_embedding_gradients_are_finite_differences_repeated_ids_summed(cluster_factory):
    c = script_cluster(cluster_factory)
    job = st.init(config=c.config, master=c.master, index=0)
    assert job.tables == [("w", (DIM,)), ("item", DIM)]
    model = job.distribute(WithW())
    emb = job.embedding("item")
    tasks = job.tasks()
    next(tasks)
    with torch.no_grad():
        model.w.copy_(torch.tensor([0.5, -1.0, 2.0]))  # (the pserver's w is zeros)
    ids = torch.tensor([[7, 3], [3, 11], [7, 7]])  # 7 three times, 3 twice
    keys = [3, 7, 11]
    before = emb(torch.tensor(keys)).detach().double()
    rows = emb(ids)
    assert rows.shape == (3, 2, DIM) and rows.dtype == torch.float32
    # The rows of a repeated id are the same row.
    assert torch.equal(rows[0, 0], rows[2, 0]) and torch.equal(rows[0, 1], rows[1, 0])
    loss = loss_of(rows, model.w.detach())
    loss.backward()
    # Finite differences of the loss in each element of each row, in float64.
    w = model.w.detach().double()

    def f(table):
        lookup = {k: table[i] for i, k in enumerate(keys)}
        r = torch.stack([torch.stack([lookup[int(i)] for i in row]) for row in ids])
        return float(loss_of(r, w))

    eps = 1e-6
    fd = torch.zeros(len(keys), DIM, dtype=torch.float64)
    for i in range(len(keys)):
        for j in range(DIM):
            plus, minus = before.clone(), before.clone()
            plus[i, j] += eps
            minus[i, j] -= eps
            fd[i, j] = (f(plus) - f(minus)) / (2 * eps)
    job.step(ids.shape[0], loss=float(loss))
    # The push carried the gradient summed over the step's n records (n
    # times the mean loss's) and the pserver's sgd averaged it over them:
    # each row moved by -lr * fd.
    rows_after = emb(torch.tensor(keys)).detach().double()
    np.testing.assert_allclose((rows_after - before).numpy(), (-LR * fd).numpy(),
                               rtol=1e-3, atol=1e-5)
    job.close()


def test_an_empty_batch_and_bad_ids(cluster_factory):
    c = script_cluster(cluster_factory)
    job = st.init(config=c.config, master=c.master, index=0)
    job.distribute(WithW())
    emb = job.embedding("item")
    tasks = job.tasks()
    next(tasks)
    empty = emb(torch.zeros(0, 2, dtype=torch.int64))
    assert empty.shape == (0, 2, DIM)
    (empty.sum() + 0 * emb(torch.tensor([1])).sum()).backward()
    job.step(1)  # nothing to push for the table but its bsp step
    with pytest.raises(TypeError, match="embedding item: ids must be int64.*torch.float32"):
        emb(torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="embedding item: ids must be a tensor"):
        emb([1, 2])
    # 32-bit ids are taken; a negative id is the key 2^64 + id.
    assert emb(torch.tensor([5], dtype=torch.int32)).shape == (1, DIM)
    assert emb(torch.tensor([-1])).shape == (1, DIM)
    with pytest.raises(ValueError, match="no table nope in the job \\(its tables: w, item\\)"):
        job.embedding("nope")
    with pytest.raises(ValueError, match="table w is dense"):
        job.embedding("w")
    job.close()


class Named(torch.nn.Module):
    def __init__(self, params):
        super().__init__()
        self._named = [(n, torch.nn.Parameter(t)) for n, t in params]
        for i, (_, p) in enumerate(self._named):
            self.register_parameter("p%d" % i, p)

    def named_parameters(self, *args, **kwargs):
        return iter(self._named)


def test_a_model_whose_tables_differ_is_refused_naming_the_table(cluster_factory):
    c = script_cluster(cluster_factory)
    job = st.init(config=c.config, master=c.master, index=0)
    with pytest.raises(ValueError, match="parameter v \\(shape \\(3,\\)\\) is not a table of the "
                                         "job; its dense tables: w"):
        job.distribute(Named([("v", torch.zeros(DIM))]))
    with pytest.raises(ValueError, match="the job's table w is not a parameter of the model"):
        job.distribute(Named([]))
    with pytest.raises(ValueError, match="parameter w has shape \\(4,\\), the job's table w has "
                                         "\\(3,\\)"):
        job.distribute(Named([("w", torch.zeros(4))]))
    with pytest.raises(ValueError, match="the job's table item is sparse"):
        job.distribute(Named([("w", torch.zeros(DIM)), ("item", torch.zeros(DIM))]))
    with pytest.raises(TypeError, match="parameter w is torch.float64"):
        job.distribute(Named([("w", torch.zeros(DIM, dtype=torch.float64))]))
    job.close()


def section(text, name, until):
    """The top-level section `name` of a config's text, up to section `until`."""
    return text[text.index("\n" + name + ":") + 1:text.index("\n" + until + ":")]


def test_the_cnn_example_reaches_090_with_2_pservers_and_2_workers(cluster_factory):
    with open(os.path.join(ROOT, "conf", "torch-cnn.yaml")) as f:
        text = f.read()
    model = section(text, "model", "worker")
    data = section(text, "data", "checkpoint").replace("task_records: 2000", "task_records: 6000")
    c = cluster_factory(workers=2, pservers=2, model=model, data=data, epochs=5, batch_size=32, learning_rate=0.001,
                        extra="worker:\n  command: [/usr/bin/python3, fmnist_cnn.py]\n")
    example = os.path.join(ROOT, "examples", "torch", "fmnist_cnn.py")
    ws = [c.worker(i, [sys.executable, example]) for i in range(2)]
    summary = c.wait_summary(timeout=900)
    assert all(w.wait(timeout=60) == 0 for w in ws)
    assert summary["state"] == "succeeded", summary
    assert summary["final_test_accuracy"] >= 0.90, summary


@pytest.mark.parametrize("dense_sync", ["ps", "allreduce"])
def test_the_dlrm_example_comes_within_001_of_the_planted_auc(cluster_factory, tmp_path,
                                                               dense_sync):
    """conf/torch-dlrm.yaml's model in bsp, its dense tables on the pservers
    or (PERSIA's hybrid) by the workers' ring allreduce, the embedding on
    the pservers either way."""
    data_dir = tmp_path / "ctr"
    subprocess.run([os.path.join(BIN, "strata-gen-ctr"), "--out_dir", str(data_dir),
                    "--train_rows", "200000", "--test_rows", "10000", "--seed", "5",
                    "--max_vocab", "50"], check=True, capture_output=True)
    with open(os.path.join(ROOT, "conf", "torch-dlrm.yaml")) as f:
        text = f.read()
    data = """data:
  format: criteo
  train: {d}/train.txt
  test: {d}/test.txt
  planted: {d}/planted.json
  task_records: 20000""".format(d=data_dir)
    model = section(text, "model", "worker")
    if dense_sync == "allreduce":
        model = model.replace("  type: script", "  type: script\n  dense_sync: allreduce", 1)
        assert "dense_sync: allreduce" in model, model
    c = cluster_factory(workers=2, pservers=2, model=model, data=data,
                        consistency="bsp", epochs=4, batch_size=256,
                        extra=section(text, "sparse", "data").replace("partitions: 16",
                                                                      "partitions: 8")
                        + "\nworker:\n  command: [/usr/bin/python3, ctr_dlrm.py]\n")
    example = os.path.join(ROOT, "examples", "torch", "ctr_dlrm.py")
    ws = [c.worker(i, [sys.executable, example]) for i in range(2)]
    summary = c.wait_summary(timeout=900)
    assert all(w.wait(timeout=60) == 0 for w in ws)
    assert summary["state"] == "succeeded", summary
    with open(data_dir / "planted.json") as f:
        planted = json.load(f)["planted_test_auc"]
    assert summary["final_test_auc"] >= planted - 0.01, (summary["final_test_auc"], planted)
    if dense_sync == "allreduce":
        for i in range(2):
            with open(os.path.join(c.dir, "worker-%d.log" % i)) as f:
                log = f.read()
            assert "dense tables by allreduce among the workers" in log, log[-2000:]
            assert re.search(r"dense allreduce: ring of view \d+: nodes \d+, \d+, this one", log)
