"""strata.torch: a PyTorch script as a Strata worker, against real master
and pserver processes (tests/python/conftest.py)."""

import os
import re
import signal
import struct
import subprocess
import sys
import time

import numpy as np
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


def test_a_pytorch_worker_follows_the_leader_of_two_masters(cluster_factory, tmp_path):
    """Two masters elect a leader through etcd (docs/reliability.md, "Master
    high availability"): the PyTorch script, given the standby first,
    follows its redirect to the leader; the leader SIGKILLed mid-job, the
    standby leads from the state in etcd and the script trains on to the
    end of the job."""
    import json
    import urllib.request
    from conftest import start_etcd
    assert os.path.exists("/usr/bin/etcd"), "scripts/install-deps.sh --test installs etcd-server"
    etcd, endpoint = start_etcd(str(tmp_path))
    try:
        c = cluster_factory(steps_records=32000, etcd=endpoint)
        w = run_example(c)
        status = "http://127.0.0.1:%d/status" % (int(c.master.split(":")[-1]) + 1)
        samples, end = 0, time.time() + 60
        while samples < 3200 and time.time() < end and w.poll() is None:
            try:
                with urllib.request.urlopen(status, timeout=1) as r:
                    samples = int(json.load(r)["job"].get("samples", 0))
            except OSError:
                pass
            time.sleep(0.05)
        assert samples >= 3200, "the job did not train under the first leader"
        c.procs[0].kill()
        summary = c.wait_summary(timeout=120)
        assert w.wait(timeout=60) == 0
        assert summary["state"] == "succeeded", summary
        assert summary["steps"] == 500
        assert any("master restarted (restart 1)" in e and "replayed from etcd" in e
                   for e in summary["events"]), summary["events"]
        assert summary["final_test_accuracy"] > 0.7
    finally:
        etcd.kill()
        etcd.wait()


def checkpoint_values(root):
    """The fp32 values (stream 2) of every partition file of the one
    checkpoint under `root`, by file name (docs/checkpoint-format.md;
    blocks uncompressed: checkpoint.compression_level 0)."""
    (ckpt,) = [d for d in os.listdir(root) if d.startswith("ckpt-")]
    out = {}
    for name in sorted(os.listdir(os.path.join(root, ckpt))):
        if not name.endswith(".blk"):
            continue
        with open(os.path.join(root, ckpt, name), "rb") as f:
            data = f.read()
        assert data[:8] == b"STRATAPF", name
        at, values = 16, b""
        while at < len(data):
            magic, stream, codec, filt, _, raw, stored, _ = struct.unpack_from("<IBBBBIII", data, at)
            assert magic == 0x4B4C4253 and codec == 0, (name, magic, codec)
            payload = data[at + 20:at + 20 + stored]
            if filt == 1:  # shuffle4: byte k of every word grouped
                words = raw // 4
                payload = (np.frombuffer(payload[:words * 4], np.uint8).reshape(4, words).T
                           .tobytes() + payload[words * 4:])
            if stream == 2:
                values += payload
            at += 20 + stored
        out[name] = np.frombuffer(values, np.float32)
    return out


def assert_same_checkpoint_values(a, b, atol, rtol=1e-3):
    """Two jobs' checkpoint_values: the same files, none empty or all
    zeros, every value within atol + rtol relative. Returns the values."""
    assert sorted(a) == sorted(b) and a
    total = 0
    for name in a:
        assert a[name].shape == b[name].shape and a[name].size > 0, name
        assert not np.array_equal(a[name], np.zeros_like(a[name])), name
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=atol, err_msg=name)
        total += a[name].size
    return total


def test_same_parameters_as_the_cpp_worker(cluster_factory, tmp_path):
    """50 bsp steps of the MLP through the Python path end where the C++
    worker ends from the same initial values (the pservers', by the job's
    seed) and data order (the worker core's): the same parameters, read
    from each job's final checkpoint, to float tolerance; the same test
    figures."""
    results, params = [], []
    for python in (True, False):
        root = tmp_path / ("ck-py" if python else "ck-cpp")
        c = cluster_factory(steps_records=3200,
                            extra="checkpoint:\n  dir: %s\n  every_seconds: 3600\n"
                                  "  compression_level: 0\n" % root)
        w = run_example(c) if python else c.worker(0)
        summary = c.wait_summary()
        assert w.wait(timeout=60) == 0
        assert summary["state"] == "succeeded"
        assert summary["steps"] == 50
        results.append(summary)
        params.append(checkpoint_values(str(root)))
    py, cpp = results
    # (measured: 1.1e-6 at most)
    total = assert_same_checkpoint_values(params[0], params[1], atol=1e-5)
    assert total == 784 * 32 + 32 + 32 * 10 + 10  # every parameter of the job
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


ALLREDUCE = "model:\n  type: mlp\n  layers: [784, 32, 10]\n  activation: relu\n" \
    "  dense_sync: allreduce"


def test_allreduce_python_workers_step_the_ring_as_cpp_workers(cluster_factory, tmp_path):
    """model.dense_sync allreduce with PyTorch workers: the dense tables are
    the workers' ring's (docs/architecture.md, "Collectives"), the script's
    tensors the ring's memory. One worker: the Python path ends where the
    C++ worker ends (same initial values by the job's seed, same data
    order: the same test figures). Two Python workers: a ring of 2 trains
    the model, the pserver holds none of its tables, and the final
    checkpoint holds the 2 workers' ring shards."""
    results = []
    for python in (True, False):
        c = cluster_factory(steps_records=3200, model=ALLREDUCE)
        w = run_example(c) if python else c.worker(0)
        summary = c.wait_summary()
        assert w.wait(timeout=60) == 0
        assert summary["state"] == "succeeded", summary
        assert summary["steps"] == 50
        results.append(summary)
    py, cpp = results
    assert py["final_test_accuracy"] > 0.5, py
    assert abs(py["final_test_accuracy"] - cpp["final_test_accuracy"]) <= 0.002, (py, cpp)
    assert abs(py["final_test_loss"] - cpp["final_test_loss"]) <= 1e-3, (py, cpp)

    root = tmp_path / "ck"
    c = cluster_factory(workers=2, steps_records=6400, model=ALLREDUCE,
                        extra="checkpoint:\n  dir: %s\n  every_seconds: 3600\n" % root)
    ws = [run_example(c, i) for i in range(2)]
    summary = c.wait_summary()
    # (The worker that did not evaluate idles in a ring step; it ends once
    # its heartbeats say the job succeeded, not at the ring's minute.)
    assert all(w.wait(timeout=30) == 0 for w in ws)
    assert summary["state"] == "succeeded", summary
    assert summary["final_test_accuracy"] > 0.7, summary
    with open(os.path.join(c.dir, "master.log")) as f:
        assert "placed 0 partition(s) of 4 table(s)" in f.read()
    for i in range(2):
        with open(os.path.join(c.dir, "worker-%d.log" % i)) as f:
            log = f.read()
        assert re.search(r"dense allreduce: ring of view \d+: nodes \d+, \d+, this one", log), log
        # (backward() begins the ring's step; its buckets go as autograd
        # makes them.)
        assert "dense allreduce: steps overlap the backward pass" in log, log
    (ckpt,) = [d for d in os.listdir(root) if d.startswith("ckpt-")]
    verify = subprocess.run([os.path.join(BIN, "strata"), "checkpoint", "verify", "--dir",
                             os.path.join(root, ckpt)], capture_output=True, text=True)
    assert verify.returncode == 0 and "2 ring shards" in verify.stdout, verify


def run_scripts(cluster, script, timeout):
    """Runs `script` as each of the cluster's 2 workers to the job's end:
    the summary, the workers' exit codes and their logs."""
    ws = [cluster.worker(i, [sys.executable, str(script)]) for i in range(2)]
    summary = cluster.wait_summary(timeout=timeout)
    codes = [w.wait(timeout=30) for w in ws]
    logs = []
    for i in range(2):
        with open(os.path.join(cluster.dir, "worker-%d.log" % i)) as f:
            logs.append(f.read())
    return summary, codes, logs


SLOW_EVALUATION = """
import sys, time
sys.path.insert(0, %r)
import fmnist_mlp
load = fmnist_mlp.load
def slow(images, labels):
    if "t10k" in images:  # the test set: the evaluation takes this much longer
        time.sleep(%d)
    return load(images, labels)
fmnist_mlp.load = slow
fmnist_mlp.main()
"""


def test_allreduce_idle_workers_outlast_a_long_evaluation(cluster_factory, tmp_path):
    """The worker that evaluates takes longer over its test pass (30 s)
    than the ring's timeout (10 s: request_timeout_ms 2000, at least 10 s)
    and its time to form again (2 x 3 s dead timeout + 2 s) together. The
    other worker steps no ring meanwhile: it leaves its step once the
    master has chosen the evaluator (the final checkpoint taken), and both
    exit 0. (It exited with "formed no ring" before.)"""
    script = tmp_path / "slow_evaluation.py"
    script.write_text(SLOW_EVALUATION % (os.path.dirname(EXAMPLE), 30))
    c = cluster_factory(workers=2, steps_records=3200, model=ALLREDUCE,
                        cluster_extra="  request_timeout_ms: 2000\n")
    summary, codes, logs = run_scripts(c, script, timeout=150)
    assert summary["state"] == "succeeded", summary
    assert codes == [0, 0], logs
    evaluators = [i for i in range(2) if "test accuracy" in logs[i]]
    assert len(evaluators) == 1, logs
    idle = logs[1 - evaluators[0]]
    assert re.search(r"training is over \(node \d+ evaluates\): no dense allreduce step", idle), idle
    assert "formed no ring" not in idle, idle


FAILING_BACKWARD = """
import os
import runpy
import sys
import torch
sys.path.insert(0, %r)
import strata.torch


class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("a backward pass that fails, for the test")


if os.environ["STRATA_INDEX"] == "0":
    steps = [0]
    backward = strata.torch.Job.backward

    def failing(self, loss, batch_size):
        steps[0] += 1
        return backward(self, Boom.apply(loss) if steps[0] == 11 else loss, batch_size)

    strata.torch.Job.backward = failing
runpy.run_path(%r, run_name="__main__")
"""


def test_a_ring_of_2_whose_other_member_dies_mid_step_goes_on_at_once(cluster_factory, tmp_path):
    """A ring of 2 PyTorch workers: worker 0's backward pass raises in its
    11th step, after the ring's step began. It abandons the step, its task
    fails and its script ends. Worker 1 waits in that step for worker 0's
    part, on no connection that breaks (it sends nothing then): its wait
    ends once the view leaves worker 0 out (DenseSync::AbortIfLeft, from
    the heartbeat's view), not at the ring's timeout (a minute here), and
    it trains the job alone, worker 0's task too."""
    script = tmp_path / "failing_backward.py"
    script.write_text(FAILING_BACKWARD % (os.path.dirname(EXAMPLE), EXAMPLE))
    c = cluster_factory(workers=2, steps_records=3200, model=ALLREDUCE)
    summary, codes, logs = run_scripts(c, script, timeout=120)
    assert summary["state"] == "succeeded", (summary, logs)
    assert codes[0] != 0 and "a backward pass that fails, for the test" in logs[0], logs[0][-3000:]
    assert codes[1] == 0, logs[1][-3000:]
    assert re.search(r"dense allreduce: step 10 failed: UNAVAILABLE", logs[1]), logs[1][-3000:]
    assert "DEADLINE_EXCEEDED" not in logs[1], logs[1][-3000:]
    assert re.search(r"dense allreduce: ring of view \d+: nodes \d+, this one rank 0", logs[1]), \
        logs[1][-3000:]
    assert summary["final_test_accuracy"] > 0.5, summary


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
    # backward(): pushed from the hooks; step() takes its batch size.
    before = model.ps[3].detach().clone()
    out = torch.relu(x @ model.ps[0] + model.ps[1]) @ model.ps[2] + model.ps[3]
    job.backward(out.sum(), 4)
    assert float(model.ps[3].grad.abs().sum()) > 0  # PyTorch's gradient until step()
    job.step()
    assert not torch.equal(model.ps[3].detach(), before)
    assert model.ps[3].grad.data_ptr() == job._core.grad(3).__array_interface__["data"][0]
    assert float(model.ps[3].grad.abs().sum()) == 0
    job.close()


def steps_of(cluster):
    r = subprocess.run([os.path.join(BIN, "strata"), "status", "--master", cluster.master,
                        "--json", "--plaintext"], capture_output=True, text=True, timeout=30)
    m = re.search(r'"steps": "(\d+)"', r.stdout)
    return int(m.group(1)) if m else 0


def test_sigterm_checkpoints_and_stops_the_job_as_for_a_cpp_worker(cluster_factory, tmp_path):
    """A preemption notice to a script worker: the master checkpoints the
    job and stops it cleanly; the script's tasks() ends and it exits 0."""
    c = cluster_factory(steps_records=60000, epochs=3,
                        extra="checkpoint:\n  dir: %s\n  every_seconds: 3600\n"
                              % (tmp_path / "ck"))
    w = run_example(c)
    end = time.time() + 120
    while steps_of(c) < 30:
        assert time.time() < end and w.poll() is None, "the worker did not train"
        time.sleep(0.1)
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=120) == 0
    summary = c.wait_summary()
    assert summary["state"] == "stopped", summary
    assert summary["checkpoints"] == 1, summary
    with open(os.path.join(c.dir, "master.log")) as f:
        assert "sigterm on worker 0" in f.read()
    with open(os.path.join(c.dir, "worker-0.log")) as f:
        assert "SIGTERM: asking the master for a checkpoint and a clean stop" in f.read()


def test_a_drained_script_worker_leaves_and_the_job_goes_on(cluster_factory):
    c = cluster_factory(workers=2, steps_records=19200)
    ws = [run_example(c, i) for i in range(2)]
    end = time.time() + 120
    while steps_of(c) < 20:
        assert time.time() < end and all(w.poll() is None for w in ws), "no training"
        time.sleep(0.1)
    r = subprocess.run([os.path.join(BIN, "strata"), "drain", "worker-1", "--master", c.master,
                        "--plaintext", "--timeout", "120"], capture_output=True, text=True,
                       timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws[1].wait(timeout=60) == 0  # its tasks() ended: the script finished
    summary = c.wait_summary()
    assert ws[0].wait(timeout=60) == 0
    assert summary["state"] == "succeeded", summary
    assert summary["records_done"] == 19200, summary


def staged_step_matches_the_job(job, model, device):
    """A few steps of a model whose parameters are copies of the worker's
    memory (staged): each step's pulled values reach the parameters, the
    gradients reach the push and are zeroed."""
    shapes = [s for _, s in job.tables]
    tasks = job.tasks()
    next(tasks)
    host = [torch.from_numpy(job._core.param(i)).view(s) for i, s in enumerate(shapes)]
    for p, h in zip(model.ps, host):
        assert p.device.type == device
        assert torch.equal(p.detach().cpu(), h)  # the task's values, copied in
    assert model.ps[0].abs().sum() > 0
    x = torch.ones(4, 784, device=device)
    for _ in range(3):
        before = model.ps[3].detach().clone()
        out = torch.relu(x @ model.ps[0] + model.ps[1]) @ model.ps[2] + model.ps[3]
        out.sum().backward()
        job.step(4, loss=1.0)
        assert not torch.equal(model.ps[3].detach(), before)  # moved by the step
        for p, h in zip(model.ps, host):
            assert torch.equal(p.detach().cpu(), h)
            assert float(p.grad.abs().sum()) == 0  # zeroed for the next step
    job.close()


def test_a_staged_model_trains_through_copies_of_the_worker_memory(cluster_factory):
    """The CUDA path's copies, on the CPU (distribute(_stage=True))."""
    c = cluster_factory(steps_records=640)
    job = st.init(config=c.config, master=c.master, index=0)
    model = job.distribute(Wrong([s for _, s in job.tables]), _stage=True)
    staged_step_matches_the_job(job, model, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_cuda_model_trains_through_pinned_host_copies(cluster_factory):
    c = cluster_factory(steps_records=640)
    job = st.init(config=c.config, master=c.master, index=0)
    model = job.distribute(Wrong([s for _, s in job.tables]).cuda())
    staged_step_matches_the_job(job, model, "cuda")


def test_strata_worker_traces_a_scripts_steps(cluster_factory, tmp_path):
    """strata-worker --trace for a worker.command script: the worker core
    traces the script's steps into the file."""
    c = cluster_factory(steps_records=1280,
                        extra="worker:\n  command: [/usr/bin/python3, %s]\n" % EXAMPLE)
    trace = tmp_path / "trace.json"
    w = c.worker(0, [os.path.join(BIN, "strata-worker"), "--config", c.config, "--master",
                     c.master, "--index", "0", "--http_port", "-1", "--trace", str(trace)])
    summary = c.wait_summary()
    assert w.wait(timeout=60) == 0
    assert summary["state"] == "succeeded", summary
    text = trace.read_text()
    assert text.count('"name": "step"') == 20, text[:500]


@pytest.mark.parametrize("dense_sync", ["ps", "allreduce"])
def test_backward_without_step_at_a_task_end_fails_the_task(cluster_factory, dense_sync):
    """A step begun by backward() and never finished: the task fails (its
    pushes may have been applied; with allreduce none went out, but its
    batch is not trained), nothing hangs, and the next step says why."""
    c = cluster_factory(steps_records=1280, **({"model": ALLREDUCE} if dense_sync == "allreduce"
                                               else {}))
    job = st.init(config=c.config, master=c.master, index=0)
    model = job.distribute(Wrong([s for _, s in job.tables]))
    x = torch.ones(4, 784)
    with pytest.raises(RuntimeError, match="not followed by job.step"):
        for _ in job.tasks():
            out = torch.relu(x @ model.ps[0] + model.ps[1]) @ model.ps[2] + model.ps[3]
            job.backward(out.sum(), 4)
    assert float(model.ps[3].grad.abs().sum()) == 0  # the worker's buffers again, zeroed
    with pytest.raises(RuntimeError, match="not finished by step"):
        job.finish()


def test_step_over_other_records_than_backward_fails_the_task_saying_so(cluster_factory):
    c = cluster_factory(steps_records=1280)
    job = st.init(config=c.config, master=c.master, index=0)
    model = job.distribute(Wrong([s for _, s in job.tables]))
    x = torch.ones(4, 784)
    tasks = job.tasks()
    next(tasks)
    out = torch.relu(x @ model.ps[0] + model.ps[1]) @ model.ps[2] + model.ps[3]
    job.backward(out.sum(), 4)
    with pytest.raises(ValueError, match="step\\(\\) over 8 records, the backward pass was over 4"):
        job.step(8)
    assert float(model.ps[3].grad.abs().sum()) == 0  # the worker's buffers again, zeroed
    tasks.close()
    job.close()



class Layers(torch.nn.Module):
    """Modules of their own (hooked one by one), one whose forward reads a
    child's parameters without calling it (nn.MultiheadAttention's
    out_proj), a Sequential, and a parameter of the model itself."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(784, 32)
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.out = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(32, 10))
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        h = self.fc(x).view(-1, 2, 16)
        h, _ = self.attn(h, h, h, need_weights=False)
        return self.out(h.flatten(1)) * self.scale


class RecordingCore:
    """The job's core with its wait_tables calls logged."""

    def __init__(self, core, log):
        self._core = core
        self._log = log

    def wait_tables(self, tables):
        self._log.append(("wait", tuple(tables)))
        return self._core.wait_tables(tables)

    def __getattr__(self, name):
        return getattr(self._core, name)


def test_prefetch_waits_for_each_modules_parameters_before_its_forward(cluster_factory):
    """distribute(prefetch=True): step() returns with the next step's pulls
    landing; before each module's forward its parameters (a child's read
    without calling it included) are waited for; 20 bsp steps end with the
    same parameters as without prefetch; model(x) and job.wait() settle."""
    from strata.data import read_idx_pair
    x, y = read_idx_pair(FMNIST + "/train-images-idx3-ubyte.gz",
                         FMNIST + "/train-labels-idx1-ubyte.gz")
    x, y = torch.from_numpy(x.reshape(len(x), -1)[:1280]), torch.from_numpy(y[:1280])
    ends = []
    for prefetch in (False, True):
        # (Tables declared by the script: both jobs start from Layers()'s values.)
        c = cluster_factory(model="model:\n  type: script",
                            extra="worker:\n  command: [/usr/bin/python3, x.py]\n",
                            steps_records=1280)
        job = st.init(config=c.config, master=c.master, index=0)
        model = job.distribute(Layers(), prefetch=prefetch)
        index = {name: i for i, (name, _) in enumerate(job.tables)}
        log = []
        job._core = RecordingCore(job._core, log)
        for name, m in model.named_modules():  # (after the job's hooks: run after them)
            m.register_forward_pre_hook(lambda m, inputs, name=name: log.append(("forward", name)))
        for records in job.tasks():
            for b in range(0, len(records), 64):
                idx = records[b:b + 64]
                if b == 128 and prefetch:
                    assert job._ahead  # (the previous step's pulls may still land)
                    job.wait()
                    assert not job._ahead
                    log.clear()
                if b == 256 and prefetch:
                    log.clear()
                    assert job._ahead
                loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
                assert not job._ahead  # settled once model(x) returned
                if b == 256 and prefetch:
                    waited = []
                    for kind, what in log:
                        if kind == "wait":
                            waited.extend(what)
                        elif what in ("fc", "attn", "out.1"):
                            owned = [i for n, i in index.items() if n.startswith(what + ".")]
                            assert owned and set(owned) <= set(waited), (what, log)
                    assert log[0] == ("wait", (index["scale"],)), log  # before the model's forward
                    assert set(waited) == set(index.values()), log
                job.backward(loss, len(idx))
                job.step(len(idx))
        if not prefetch:
            assert not any(kind == "wait" for kind, _ in log)
        ends.append({n: p.detach().clone() for n, p in model.named_parameters()})
        job.finish(metrics={"test_accuracy": 0.5})
        assert c.wait_summary()["steps"] == 20
    for name, v in ends[0].items():
        torch.testing.assert_close(ends[1][name], v, rtol=1e-5, atol=1e-6, msg=name)
