"""A real Strata cluster for the Python package's tests: strata-master and
strata-pserver processes from the build tree (STRATA_BIN), on free ports
of 127.0.0.1, with the job's config written for each test."""

import os
import random
import shutil
import socket
import subprocess
import sys
import time

import pytest

BIN = os.path.abspath(os.environ.get("STRATA_BIN",
                                     os.path.join(os.path.dirname(__file__), "../../build/bin")))
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
FMNIST = "/usr/share/datasets/fashion-mnist"


def _reservation_over(path):
    """A port reservation whose test's process has exited, or older than 20
    minutes (tests/e2e/lib.sh's pick_port_base lets go of the same)."""
    try:
        if time.time() - os.path.getmtime(path) > 20 * 60:
            return True
        with open(os.path.join(path, "pid")) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return False  # (being made, or gone)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass
    return False


def port_base():
    """A base for a cluster's ports (base + 0, 1 for the master; + 10, 20,
    30, 40 and the next ones for pservers and workers), below the ephemeral
    range so that no outgoing connection takes one meanwhile, free now and
    reserved in /tmp/strata-test-ports as tests/e2e/lib.sh's pick_port_base
    does (so no test running beside this one takes it too)."""
    reserved = "/tmp/strata-test-ports"
    os.makedirs(reserved, exist_ok=True)
    for _ in range(200):
        base = 20000 + random.randrange(120) * 100
        try:
            for off in (0, 1, 10, 11, 20, 21, 30, 31, 40, 41):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + off))
            os.mkdir(os.path.join(reserved, str(base)))
            with open(os.path.join(reserved, str(base), "pid"), "w") as f:
                f.write("%d\n" % os.getpid())
            return base
        except FileExistsError:
            path = os.path.join(reserved, str(base))
            if _reservation_over(path):  # let go of: taken on a later try
                shutil.rmtree(path, ignore_errors=True)
            continue
        except OSError:
            continue
    raise RuntimeError("no free port base in 200 tries")


def job_config(path, workers=1, steps_records=3200, layers=(784, 32, 10), consistency="bsp",
               chunk_bytes=16384, model=None, data=None, extra="", epochs=1, batch_size=64,
               learning_rate=0.002, cluster_extra="", optimizer="adam"):
    """`model`, `data`: YAML of those sections in place of the MLP on
    Fashion-MNIST; `extra`: more sections; `cluster_extra`: more lines of
    the cluster section (indented)."""
    base = port_base()
    ports = {"master": base, "master_http": base + 1}
    with open(path, "w") as f:
        f.write("""job:
  name: pytest
  consistency: %s
  epochs: %d
  batch_size: %d
  progress_every_steps: 1000000
  seed: 7
%s
optimizer:
  type: %s
  learning_rate: %g
%s
%scluster:
  slice_bytes: 65536
  chunk_bytes: %d
  heartbeat_interval_ms: 200
  dead_timeout_ms: 3000
%s  ports: {master: %d, master_http: %d, pserver: 0, pserver_data: 0, pserver_http: 0, worker_http: 0}
security:
  mode: plaintext
""" % (consistency, epochs, batch_size,
       model or "model:\n  type: mlp\n  layers: [%s]\n  activation: relu"
       % ", ".join(str(x) for x in layers),
       optimizer, learning_rate,
       data or """data:
  format: idx
  train_images: %s/train-images-idx3-ubyte.gz
  train_labels: %s/train-labels-idx1-ubyte.gz
  test_images: %s/t10k-images-idx3-ubyte.gz
  test_labels: %s/t10k-labels-idx1-ubyte.gz
  task_records: 640
  train_limit: %d""" % (FMNIST, FMNIST, FMNIST, FMNIST, steps_records),
       extra, chunk_bytes, cluster_extra, ports["master"], ports["master_http"]))
    return "127.0.0.1:%d" % ports["master"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_etcd(directory):
    """A single-member etcd (Debian's etcd-server) on free ports of
    127.0.0.1, its data in `directory`: (process, endpoint), once it
    answers."""
    client, peer = free_port(), free_port()
    c, p = "http://127.0.0.1:%d" % client, "http://127.0.0.1:%d" % peer
    log = open(os.path.join(directory, "etcd.log"), "w")
    proc = subprocess.Popen(
        ["/usr/bin/etcd", "--name", "e", "--data-dir", os.path.join(directory, "etcd"),
         "--listen-client-urls", c, "--advertise-client-urls", c, "--listen-peer-urls", p,
         "--initial-advertise-peer-urls", p, "--initial-cluster", "e=" + p],
        stdout=log, stderr=subprocess.STDOUT)
    end = time.time() + 15
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", client), timeout=0.2).close()
            return proc, "127.0.0.1:%d" % client
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("etcd did not come up; its log: %s" % directory)


class Cluster:
    """A master and pservers; workers are the test's. `etcd`: an endpoint,
    for two masters (127.0.0.1 leading, 127.0.0.2 a standby; docs/
    reliability.md, "Master high availability"): the nodes are given the
    standby first, so that they follow its redirect."""

    def __init__(self, tmp, workers=1, pservers=1, master_args=(), etcd=None, **config):
        self.dir = str(tmp)
        os.makedirs(self.dir, exist_ok=True)
        self.config = os.path.join(self.dir, "job.yaml")
        if etcd is not None:
            config["cluster_extra"] = (config.get("cluster_extra", "") +
                                       "  etcd:\n    endpoints: [%s]\n" % etcd)
        self.master = job_config(self.config, workers=workers, **config)
        self.summary = os.path.join(self.dir, "summary.json")
        with open(os.path.join(self.dir, "hosts"), "w") as f:
            f.write("127.0.0.1 master pserver=%d worker=%d\n" % (pservers, workers))
            if etcd is not None:
                f.write("127.0.0.2 master\n")
        self.procs = []
        self.standby = etcd is not None
        self._start("master", [os.path.join(BIN, "strata-master"), "--config", self.config,
                               "--hosts", os.path.join(self.dir, "hosts"), "--summary",
                               self.summary, "--state_dir", os.path.join(self.dir, "state"),
                               "--host", "127.0.0.1", *master_args])
        if etcd is not None:
            self.wait_log("master", "this master leads")
            self._start("standby", [os.path.join(BIN, "strata-master"), "--config", self.config,
                                    "--hosts", os.path.join(self.dir, "hosts"), "--summary",
                                    self.summary, "--host", "127.0.0.2", *master_args])
            self.wait_log("standby", "standby: the leading master is 127.0.0.1")
            self.master = "127.0.0.2:%s,%s" % (self.master.split(":")[1], self.master)
        for i in range(pservers):
            self._start("pserver-%d" % i,
                        [os.path.join(BIN, "strata-pserver"), "--config", self.config,
                         "--master", self.master, "--index", str(i), "--port", "0",
                         "--data_port", "0", "--http_port", "-1"])

    def wait_log(self, name, text, timeout=30):
        path = os.path.join(self.dir, name + ".log")
        end = time.time() + timeout
        while time.time() < end:
            with open(path) as f:
                if text in f.read():
                    return
            time.sleep(0.05)
        raise AssertionError("%s: no '%s' within %d s (%s)" % (name, text, timeout, path))

    def _start(self, name, argv):
        log = open(os.path.join(self.dir, name + ".log"), "w")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def worker(self, index, argv=None, env=None):
        """A C++ worker (argv None) or a script, as a process."""
        e = dict(os.environ)
        e.update({"STRATA_CONFIG": self.config, "STRATA_MASTER": self.master,
                  "STRATA_INDEX": str(index),
                  "PYTHONPATH": os.path.join(BIN, "..", "python")})
        e.update(env or {})
        if argv is None:
            argv = [os.path.join(BIN, "strata-worker"), "--config", self.config, "--master",
                    self.master, "--index", str(index), "--http_port", "-1"]
        log = open(os.path.join(self.dir, "worker-%d.log" % index), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=e)
        self.procs.append(p)
        return p

    def wait_summary(self, timeout=120):
        import json
        end = time.time() + timeout
        while time.time() < end:
            if (not self.standby and self.procs[0].poll() is not None
                    and not os.path.exists(self.summary)):
                with open(os.path.join(self.dir, "master.log")) as f:
                    tail = f.read()[-2000:]
                raise AssertionError("the master exited (%d) without a summary:\n%s"
                                     % (self.procs[0].returncode, tail))
            if os.path.exists(self.summary):
                with open(self.summary) as f:
                    text = f.read()
                if text.strip().endswith("}"):
                    return json.loads(text)
            time.sleep(0.1)
        raise AssertionError("no summary.json after %d s; logs in %s" % (timeout, self.dir))

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def cluster_factory(tmp_path):
    made = []

    def make(**kw):
        c = Cluster(tmp_path / ("c%d" % len(made)), **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def pytest_configure(config):
    sys.path.insert(0, os.path.join(BIN, "..", "python"))
    # What ctest's SKIP_REGULAR_EXPRESSION looks for (tests/CMakeLists.txt).
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.__stdout__.write("python_package_test skipped: python3-torch is not installed "
                             "(scripts/install-deps.sh --test installs it)\n")
    if not os.path.isdir(FMNIST):
        sys.__stdout__.write("python_package_test skipped: dataset-fashion-mnist is not "
                             "installed\n")
