"""Tables declared by the training script (model.type script without
model.tables, docs/python.md): the first worker's distribute() makes its
model the job's tables and its values their initial values; the other
workers' models must be the same and start from those values; a
different model is refused naming the table. Against real master and
pserver processes (tests/python/conftest.py)."""

import os

import pytest

torch = pytest.importorskip("torch", reason="python3-torch not installed (install-deps.sh --test)")
import strata.torch as st  # noqa: E402

from conftest import FMNIST  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir(FMNIST),
                                reason="dataset-fashion-mnist not installed")

DECLARED = "model:\n  type: script"
EXTRA = """sparse:
  partitions: 4
  init: {type: normal, scale: 0.5}
  optimizer: {type: sgd, learning_rate: 0.1}
worker:
  command: [/usr/bin/python3, unused.py]
"""


class Net(torch.nn.Module):
    def __init__(self, seed, hidden=16, embedding=None):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.fc = torch.nn.Linear(4 * 26 * 26, hidden)
        self.out = torch.nn.Linear(hidden, 10)
        self.scale = torch.nn.Parameter(torch.tensor(1.5))  # a 0-d parameter
        self.embedding = embedding


def values(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_the_first_workers_values_initialise_the_tables_the_script_declares(cluster_factory):
    c = cluster_factory(workers=2, pservers=2, model=DECLARED, extra=EXTRA)
    first = st.init(config=c.config, master=c.master, index=0)
    assert first.tables == []  # (none until declared)
    with pytest.raises(ValueError, match="give its row width, job.embedding"):
        first.embedding("item")
    m0 = Net(seed=1, embedding=first.embedding("item", dim=5))
    with pytest.raises(RuntimeError, match="embedding item is not a table of the job yet"):
        m0.embedding(torch.tensor([1, 2]))
    # Refused before anything is declared: the worker may try again.
    with pytest.raises(TypeError, match="parameter .* is torch.float64"):
        first.distribute(Net(seed=1, embedding=m0.embedding).double())
    assert first.tables == []
    want = values(m0)
    first.distribute(m0)
    # named_parameters() order (the module's own first), then the embeddings.
    assert first.tables == [("scale", (1,)), ("conv.weight", (4, 1, 3, 3)), ("conv.bias", (4,)),
                            ("fc.weight", (16, 2704)), ("fc.bias", (16,)),
                            ("out.weight", (10, 16)), ("out.bias", (10,)), ("item", 5)]

    second = st.init(config=c.config, master=c.master, index=1)
    # A different model is refused, naming the first table that differs;
    # the worker may then declare the right one.
    with pytest.raises(RuntimeError, match="table 3 is fc.weight \\(dense \\[32, 2704\\]\\) in the "
                                           "model of worker 1 .*, fc.weight \\(dense \\[16, 2704\\]"
                                           "\\) in the tables declared by worker 0"):
        second.distribute(Net(seed=2, hidden=32, embedding=second.embedding("item", dim=5)))
    m1 = Net(seed=2, embedding=second.embedding("item", dim=5))
    assert not torch.equal(values(m1)["fc.weight"], want["fc.weight"])
    second.distribute(m1)
    with pytest.raises(ValueError, match="embedding item: dim 4, the job's table has dim 5"):
        second.embedding("item", dim=4)

    # Both start from the first worker's values, pulled at the first task.
    tasks = [first.tasks(), second.tasks()]
    for t in tasks:
        next(t)
    for model in (m0, m1):
        got = values(model)
        for name, v in want.items():
            assert torch.equal(got[name], v), name
    # The sparse table's rows come from sparse.init, the same for both.
    ids = torch.tensor([3, 17, 3])
    r0, r1 = m0.embedding(ids), m1.embedding(ids)
    assert torch.equal(r0, r1) and r0.shape == (3, 5) and float(r0.abs().sum()) > 0
    for t in tasks:
        t.close()
    first.close()
    second.close()


def test_a_config_with_tables_takes_no_declaration(cluster_factory):
    c = cluster_factory(model="model:\n  type: script\n  tables:\n    - {name: w, shape: [3]}",
                        extra=EXTRA)
    job = st.init(config=c.config, master=c.master, index=0)
    with pytest.raises(ValueError, match="no table item in the job \\(its tables: w\\)"):
        job.embedding("item", dim=5)
    job.close()


class Tiny(torch.nn.Module):
    def __init__(self, seed, hidden=8):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = torch.nn.Linear(784, hidden)
        self.out = torch.nn.Linear(hidden, 10)

    def forward(self, x):
        return self.out(torch.relu(self.fc(x)))


def test_a_resumed_job_takes_the_checkpoints_declared_tables_and_values(cluster_factory, tmp_path):
    """The declared tables are in the checkpoint: a job resumed from it has
    them (and their values) before any worker declares, and refuses a
    worker whose model differs."""
    from strata.data import read_idx_pair
    x, y = read_idx_pair(FMNIST + "/train-images-idx3-ubyte.gz",
                         FMNIST + "/train-labels-idx1-ubyte.gz")
    x, y = torch.from_numpy(x.reshape(len(x), -1)), torch.from_numpy(y)
    extra = EXTRA + "checkpoint:\n  dir: %s\n  every_seconds: 3600\n" % (tmp_path / "ck")
    c = cluster_factory(model=DECLARED, extra=extra, steps_records=640)
    job = st.init(config=c.config, master=c.master, index=0)
    model = job.distribute(Tiny(seed=3))
    for records in job.tasks():
        for b in range(0, len(records), 64):
            idx = records[b:b + 64]
            job.backward(torch.nn.functional.cross_entropy(model(x[idx]), y[idx]), len(idx))
            job.step(len(idx))
    trained = values(model)
    job.finish(metrics={"test_accuracy": 0.5})
    assert c.wait_summary()["state"] == "succeeded"

    resumed = cluster_factory(model=DECLARED, extra=extra, steps_records=640,
                              master_args=("--resume", "latest"))
    job = st.init(config=resumed.config, master=resumed.master, index=0)
    with pytest.raises(RuntimeError, match="table 0 is fc.weight \\(dense \\[16, 784\\]\\) in "
                                           "the model of worker 0 .* fc.weight \\(dense \\[8, "
                                           "784\\]\\) in the tables of the checkpoint the job "
                                           "resumed from"):
        job.distribute(Tiny(seed=4, hidden=16))
    model = job.distribute(Tiny(seed=4))
    assert list(job.tasks()) == []  # every task was done: the final model is evaluated
    assert job.evaluating
    got = values(model)
    for name, v in trained.items():
        assert torch.equal(got[name], v), name
    job.finish(metrics={"test_accuracy": 0.5})
    assert resumed.wait_summary()["state"] == "succeeded"
