"""strata.torch: a PyTorch script as a Strata worker, against real master
and pserver processes (tests/python/conftest.py)."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="python3-torch not installed (install-deps.sh --test)")
import strata.torch as st  # noqa: E402

from conftest import BIN, FMNIST, ROOT  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "torch", "fmnist_mlp.py")
pytestmark = pytest.mark.skipif(not os.path.isdir(FMNIST),
                                reason="dataset-fashion-mnist not installed")


def run_example(cluster, index=0):
    return cluster.worker(index, [sys.executable, EXAMPLE])


def test_the_readme_mlp_in_pytorch_trains_as_a_worker(cluster_factory):
    c = cluster_factory(steps_records=6400)
    w = run_example(c)
    summary = c.wait_summary()
    assert w.wait(timeout=60) == 0
    assert summary["state"] == "succeeded", summary
    assert summary["steps"] == 100
    assert summary["final_test_accuracy"] > 0.7


def test_same_parameters_as_the_cpp_worker(cluster_factory):
    """50 bsp steps of the MLP through the Python path end where the C++
    worker ends from the same initial values (the pservers', by the job's
    seed) and data order (the worker core's): the same test figures."""
    results = []
    for python in (True, False):
        c = cluster_factory(steps_records=3200)
        w = run_example(c) if python else c.worker(0)
        summary = c.wait_summary()
        assert w.wait(timeout=60) == 0
        assert summary["state"] == "succeeded"
        assert summary["steps"] == 50
        results.append(summary)
    py, cpp = results
    assert abs(py["final_test_accuracy"] - cpp["final_test_accuracy"]) <= 0.002, (py, cpp)
    assert abs(py["final_test_loss"] - cpp["final_test_loss"]) <= 1e-3, (py, cpp)


def test_a_python_and_a_cpp_worker_in_one_job(cluster_factory):
    c = cluster_factory(workers=2, steps_records=6400)
    py = run_example(c, 0)
    cpp = c.worker(1)
    summary = c.wait_summary()
    assert py.wait(timeout=60) == 0 and cpp.wait(timeout=60) == 0
    assert summary["state"] == "succeeded", summary
    assert summary["final_test_accuracy"] > 0.7


def test_init_outside_a_cluster_says_how_to_launch(monkeypatch):
    for k in ("STRATA_CONFIG", "STRATA_MASTER", "STRATA_INDEX"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(RuntimeError, match="not in a Strata cluster.*launch.sh"):
        st.init()


def test_a_bad_config_is_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("job:\n  nmae: x\n")
    with pytest.raises(ValueError, match="bad.yaml:2:3: unknown key 'job.nmae'"):
        st.init(config=str(bad), master="127.0.0.1:1", index=0)


class Wrong(torch.nn.Module):
    """Parameters named as the job's tables, of these shapes."""

    def __init__(self, shapes, dtype=torch.float32, transpose=None,
                 names=("fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias")):
        super().__init__()
        self.ps = torch.nn.ParameterList(
            torch.nn.Parameter(torch.zeros(*s, dtype=dtype)) for s in shapes)
        if transpose is not None:  # a non-contiguous view of the right shape
            t = torch.zeros(*reversed(shapes[transpose])).t()
            self.ps[transpose] = torch.nn.Parameter(t)
        self.names = names

    def named_parameters(self, *args, **kwargs):
        return iter(list(zip(self.names, self.ps)))


def test_distribute_refuses_parameters_that_do_not_fit_naming_them(cluster_factory):
    c = cluster_factory(steps_records=640)
    job = st.init(config=c.config, master=c.master, index=0)
    shapes = [s for _, s in job.tables]
    assert [n for n, _ in job.tables] == ["fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"]
    with pytest.raises(TypeError, match=r"parameter fc0\.weight is torch\.float64"):
        job.distribute(Wrong(shapes, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"parameter fc1\.weight is not contiguous"):
        job.distribute(Wrong(shapes, transpose=2))
    with pytest.raises(ValueError, match=r"parameter fc0.weight has shape \(32, 784\), the job's "
                                         r"table fc0.weight has \(784, 32\)"):
        job.distribute(Wrong([(32, 784)] + shapes[1:]))
    with pytest.raises(ValueError, match="the job's table fc1.bias is not a parameter of the "
                                         "model"):
        job.distribute(Wrong(shapes[:3]))
    # A good model: its parameters hold the job's values (pulled in place
    # when a task starts).
    model = job.distribute(Wrong(shapes))
    with pytest.raises(RuntimeError, match="step\\(\\) outside a data task"):
        job.step(4)
    tasks = job.tasks()  # (kept: a generator let go ends its task)
    records = next(tasks)
    assert records.dtype == torch.int64 and len(records) == 640
    assert model.ps[0].abs().sum() > 0  # glorot values from the pservers, not the zeros
    x = torch.ones(4, 784)
    out = torch.relu(x @ model.ps[0] + model.ps[1]) @ model.ps[2] + model.ps[3]
    out.sum().backward()
    before = model.ps[3].detach().clone()
    job.step(4, loss=1.0)
    assert not torch.equal(model.ps[3].detach(), before)  # pulled in place
    assert float(model.ps[3].grad.abs().sum()) == 0  # zeroed for the next step
    job.close()
