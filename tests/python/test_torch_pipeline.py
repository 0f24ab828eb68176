"""Pipeline stages with PyTorch workers (job.pipeline, docs/python.md):
an nn.Sequential cut into model.stages stages on as many workers, against
real master and pserver processes (tests/python/conftest.py)."""

import os
import re
import sys

import pytest

torch = pytest.importorskip("torch", reason="python3-torch not installed (install-deps.sh --test)")
import strata.torch as st  # noqa: E402

from conftest import FMNIST, ROOT  # noqa: E402
from test_torch_worker import assert_same_checkpoint_values, checkpoint_values  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "torch", "fmnist_pipeline.py")
pytestmark = pytest.mark.skipif(not os.path.isdir(FMNIST),
                                reason="dataset-fashion-mnist not installed")


def mlp_model(stages, extra=""):
    return ("model:\n  type: mlp\n  layers: [784, 32, 16, 10]\n  activation: relu\n"
            "  stages: %d\n%s" % (stages, extra))


def test_two_stages_end_where_one_stage_ends(cluster_factory, tmp_path):
    """50 bsp steps of the example's nn.Sequential in 2 stages (2 workers,
    8 micro-batches a step) and in 1 (1 worker): the same parameters, read
    from each job's final checkpoint, to float tolerance, and the same
    test figures; each stage's log says which layers it holds."""
    results, params = [], []
    for stages in (2, 1):
        root = tmp_path / ("ck-%d" % stages)
        c = cluster_factory(workers=stages, steps_records=3200, model=mlp_model(stages),
                            extra="checkpoint:\n  dir: %s\n  every_seconds: 3600\n"
                                  "  compression_level: 0\n" % root)
        ws = [c.worker(i, [sys.executable, EXAMPLE]) for i in range(stages)]
        summary = c.wait_summary(timeout=180)
        for w in ws:
            assert w.wait(timeout=60) == 0
        assert summary["state"] == "succeeded", summary
        assert summary["steps"] == 50
        results.append(summary)
        params.append(checkpoint_values(str(root)))
        if stages == 2:
            logs = [open(os.path.join(c.dir, "worker-%d.log" % i)).read() for i in range(2)]
            assert "pipeline stage 0 of 2" in logs[0] and "pipeline stage 1 of 2" in logs[1]
            assert "pipeline: stage 0 of 2 (modules 0..1, tables 0..1)" in logs[0], logs[0][-3000:]
            assert "pipeline: stage 1 of 2 (modules 2..4, tables 2..5)" in logs[1], logs[1][-3000:]
    piped, whole = results
    total = assert_same_checkpoint_values(params[0], params[1], atol=1e-5)
    assert total == 784 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10
    assert abs(piped["final_test_accuracy"] - whole["final_test_accuracy"]) <= 0.002
    assert abs(piped["final_test_loss"] - whole["final_test_loss"]) <= 1e-3


CNN = os.path.join(ROOT, "tests", "python", "pipeline_cnn.py")


def run_cnn(cluster_factory, tmp_path, stages, device_of=lambda i: None):
    """pipeline_cnn.py for 30 SGD steps in `stages` stages (worker i's stage
    on device_of(i)): the summary and the final checkpoint's values."""
    root = tmp_path / ("ck-%d-%s" % (stages, device_of(0)))
    c = cluster_factory(workers=stages, steps_records=1920, optimizer="sgd", learning_rate=0.05,
                        model="model:\n  type: script\n  stages: %d" % stages,
                        extra="checkpoint:\n  dir: %s\n  every_seconds: 3600\n"
                              "  compression_level: 0\nworker:\n  command: [%s, %s]\n"
                              % (root, sys.executable, CNN))
    ws = [c.worker(i, [sys.executable, CNN],
                   env={"STRATA_TEST_STAGE_DEVICE": device_of(i)} if device_of(i) else None)
          for i in range(stages)]
    summary = c.wait_summary(timeout=240)
    for w in ws:
        assert w.wait(timeout=60) == 0
    assert summary["state"] == "succeeded", summary
    assert summary["steps"] == 30
    return c, summary, checkpoint_values(str(root))


def expect_same_params(a, b):
    # (measured: 2.3e-5 at most, the weights' sizes 0.1 and their change
    # over the job 0.02: the convolutions of 5 records and of 64 sum in
    # other orders)
    return assert_same_checkpoint_values(a, b, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_stages_on_the_gpu_end_where_one_stage_on_the_cpu_ends(cluster_factory, tmp_path):
    """job.pipeline(device="cuda"): each of 2 stages on the GPU (its pinned
    host copies), against 1 stage on the CPU."""
    _, gpu, on_gpu = run_cnn(cluster_factory, tmp_path, 2, lambda i: "cuda")
    _, cpu, on_cpu = run_cnn(cluster_factory, tmp_path, 1)
    expect_same_params(on_gpu, on_cpu)
    assert abs(gpu["final_test_accuracy"] - cpu["final_test_accuracy"]) <= 0.005


def test_a_cnn_of_declared_tables_in_three_stages_ends_where_one_stage_ends(cluster_factory,
                                                                            tmp_path):
    """tests/python/pipeline_cnn.py (conv, conv, linear; its tables declared
    by worker 0's script) for 30 steps in 3 stages, 4-d activations between
    the first two, the middle stage computing on a copy of its modules (the
    CUDA path's copies, job.pipeline(device=...), on the CPU), and in 1:
    the same parameters to float tolerance. (SGD: Adam's steps of the
    elements whose gradients are near 0 turn the rounding of the
    micro-batches' sums into differences of the order of its learning
    rate.)"""
    c, piped, params = run_cnn(cluster_factory, tmp_path, 3, lambda i: "cpu" if i == 1 else None)
    logs = [open(os.path.join(c.dir, "worker-%d.log" % i)).read() for i in range(3)]
    for s, want in enumerate(("modules 0..1, tables 0..1", "modules 2..4, tables 2..3",
                              "modules 5..5, tables 4..5")):
        assert "pipeline: stage %d of 3 (%s)" % (s, want) in logs[s], logs[s][-3000:]
    _, whole, whole_params = run_cnn(cluster_factory, tmp_path, 1)
    expect_same_params(params, whole_params)
    assert sum(a.size for a in params.values()) == 416 + 2320 + 7744 * 10 + 10
    assert abs(piped["final_test_accuracy"] - whole["final_test_accuracy"]) <= 0.002


def script_cluster(cluster_factory, stages):
    return cluster_factory(workers=stages,
                           model="model:\n  type: script\n  stages: %d" % stages,
                           extra="worker:\n  command: [/usr/bin/python3, unused.py]\n")


def test_bad_pipelines_are_refused_naming_what_does_not_fit(cluster_factory):
    c = script_cluster(cluster_factory, 3)
    job = st.init(config=c.config, master=c.master, index=0)
    try:
        with pytest.raises(TypeError, match="cuts an nn.Sequential into stages; got Linear"):
            job.pipeline(torch.nn.Linear(4, 2), input_shape=(4,))
        with pytest.raises(ValueError, match="give input_shape"):
            job.pipeline(torch.nn.Sequential(torch.nn.Linear(4, 2)))
        with pytest.raises(ValueError, match=r"module 1 \(Linear\) does not take an input of "
                                             r"shape \(3,\)"):
            job.pipeline(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(5, 2),
                                             torch.nn.ReLU()), input_shape=(4,))
        with pytest.raises(ValueError, match=r"job.yaml: model.stages is 3 but the "
                                             r"nn.Sequential has 2 modules"):
            job.pipeline(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)),
                         input_shape=(4,))
        assert job.tables == []  # (nothing declared: the script may try again)
    finally:
        job.close()
    c = script_cluster(cluster_factory, 2)
    job = st.init(config=c.config, master=c.master, index=1)
    try:
        # The cut leaves the first stage a ReLU alone: refused by the
        # second stage's worker too.
        with pytest.raises(ValueError, match=r"model.stages 2: stage 0 \(modules 0..0\) has no "
                                             r"parameters to train: fewer stages"):
            job.pipeline(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(4, 2)),
                         input_shape=(4,))
        with pytest.raises(ValueError, match=r"module 1 \(BatchNorm1d\) keeps buffers "
                                             r"\(running_mean, running_var, num_batches_tracked\)"):
            job.pipeline(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),
                                             torch.nn.Linear(3, 2)), input_shape=(4,))
        assert job.tables == []
    finally:
        job.close()
    c = script_cluster(cluster_factory, 2)
    job = st.init(config=c.config, master=c.master, index=0)
    try:
        pipe = job.pipeline(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(),
                                                torch.nn.Linear(3, 2)), input_shape=(4,))
        assert (pipe.stage, pipe.stages, pipe.micro_batches) == (0, 2, 8)
        with pytest.raises(ValueError, match="records of 5 values, the pipeline's input_shape "
                                             "makes 4"):
            pipe.step(torch.zeros(2, 5), torch.zeros(2, dtype=torch.int64))
        with pytest.raises(ValueError, match="pipeline step of 2 records and 3 labels"):
            pipe.step(torch.zeros(2, 4), torch.zeros(3, dtype=torch.int64))
        with pytest.raises(RuntimeError, match=r"step\(\) outside a data task"):
            pipe.step(torch.zeros(2, 4), torch.zeros(2, dtype=torch.int64))
        with pytest.raises(RuntimeError, match="job.pipeline.. was called already"):
            job.pipeline(torch.nn.Sequential(torch.nn.Linear(4, 2)), input_shape=(4,))
    finally:
        job.close()
    c = script_cluster(cluster_factory, 1)
    job = st.init(config=c.config, master=c.master, index=0)
    try:
        with pytest.raises(ValueError, match=r"job.pipeline\(device=cpu\): model.stages is 1 in "
                                             r".*job.yaml; move the model itself"):
            job.pipeline(torch.nn.Sequential(torch.nn.Linear(4, 2)), input_shape=(4,),
                         device="cpu")
    finally:
        job.close()


def test_a_stage_that_raises_fails_the_step_which_is_tried_again(cluster_factory):
    """The last stage's loss raises once, and its begin_step once
    (tests/python/pipeline_cnn.py, STRATA_TEST_RAISE_ONCE): each time the
    step fails (with the exception's text in the first stage's log, or the
    stage's), is tried again, and the job goes on to its end; the raising
    script did not die."""
    c = cluster_factory(workers=2, steps_records=640,
                        model="model:\n  type: script\n  stages: 2",
                        extra="worker:\n  command: [%s, %s]\n" % (sys.executable, CNN))
    ws = [c.worker(i, [sys.executable, CNN], env={"STRATA_TEST_RAISE_ONCE": "1"})
          for i in range(2)]
    summary = c.wait_summary(timeout=120)
    for w in ws:
        assert w.wait(timeout=60) == 0
    assert summary["state"] == "succeeded", summary
    assert summary["steps"] == 10
    log = open(os.path.join(c.dir, "worker-0.log")).read()
    assert re.search(r"pipeline: step \d+ failed \(.*the training script's pipeline stage raised "
                     r"in backward\(\): RuntimeError: a bug in the last stage's loss", log), \
        log[-3000:]
    # Its begin_step raising once: the stage could not begin the step,
    # dropped itself (the leader's micro-batches answered at once) and the
    # leader tried again.
    log1 = open(os.path.join(c.dir, "worker-1.log")).read()
    assert re.search(r"pipeline stage 1: step \d+ could not begin \(.*raised in begin_step\(\): "
                     r"RuntimeError: a bug in a stage's begin_step", log1), log1[-3000:]
    assert log.count("trying it again once the group is whole") >= 2, log[-3000:]


def test_a_stage_adds_its_gradients_in_the_workers_memory_whatever_grad_was():
    """_Stage (CPU), as the worker core calls it: the micro-batches'
    gradients add up in the worker's memory (the tensors pushed), also
    when the script let .grad go between steps (zero_grad(set_to_none))."""
    torch.manual_seed(1)
    lin = torch.nn.Linear(3, 2)
    host = [torch.zeros_like(p) for p in lin.parameters()]
    for p, g in zip(lin.parameters(), host):
        p.grad = g  # (as distribute() aliases them)
    stage = st._Stage(torch.nn.Sequential(lin), (3,), torch.nn.functional.cross_entropy,
                      first=True, last=True)
    x = torch.randn(4, 3)
    y = torch.tensor([0, 1, 1, 0], dtype=torch.int32)
    want = torch.nn.functional.cross_entropy(lin(x), y.long()) * 4
    expected = torch.autograd.grad(want, list(lin.parameters()))
    for _ in range(2):
        lin.zero_grad(set_to_none=True)
        stage.begin_step()
        for m, rows in enumerate((slice(0, 1), slice(1, 4))):  # 2 micro-batches
            summed, correct = stage.backward(m, x[rows].numpy(), y[rows].numpy(), None, None)
        stage.end_step()
        for g, e in zip(host, expected):
            torch.testing.assert_close(g, e)
