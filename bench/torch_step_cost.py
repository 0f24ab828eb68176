#!/usr/bin/python3
"""The Python layer's cost per step (docs/performance.md, issue 25).

Starts a master and 2 pservers from build/bin (plaintext, 127.0.0.1) for
the README's MLP (784-256-128-10, bsp, batch 64) and joins the job as its
one worker, in this process, through strata.torch. Then, alternated in
rounds:

  no model  job.step(64) alone: the gradients are what they are, nothing
            is computed. The step's wall time less the worker core's
            exchange time (its comm_seconds) is what the Python layer adds
            to a step: the bindings, the gradient scaling and zeroing, the
            GIL hand-offs.
  model     the MLP's forward and backward in PyTorch, then job.step(64).

    /usr/bin/python3 bench/torch_step_cost.py [--steps 300] [--rounds 3]

Prints one line per round and the medians, in microseconds per step.
"""

import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BIN = os.path.join(ROOT, "build", "bin")
sys.path.insert(0, os.path.join(ROOT, "build", "python"))
FMNIST = "/usr/share/datasets/fashion-mnist"

CONFIG = """job: {name: step-cost, consistency: bsp, epochs: 50, batch_size: 64,
      progress_every_steps: 1000000, seed: 1}
model: {type: mlp, layers: [784, 256, 128, 10]}
optimizer: {type: adam, learning_rate: 0.0005}
data:
  format: idx
  train_images: %(d)s/train-images-idx3-ubyte.gz
  train_labels: %(d)s/train-labels-idx1-ubyte.gz
  test_images: %(d)s/t10k-images-idx3-ubyte.gz
  test_labels: %(d)s/t10k-labels-idx1-ubyte.gz
  task_records: 6400
cluster:
  slice_bytes: 262144
  ports: {master: %(p)d, master_http: %(h)d, pserver: 0, pserver_data: 0, pserver_http: 0,
          worker_http: 0}
security: {mode: plaintext}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch
    import strata.torch as st
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="strata-step-cost-")
    port = free_port()
    config = os.path.join(work, "job.yaml")
    with open(config, "w") as f:
        f.write(CONFIG % {"d": FMNIST, "p": port, "h": free_port()})
    with open(os.path.join(work, "hosts"), "w") as f:
        f.write("127.0.0.1 master pserver=2 worker=1\n")
    log = open(os.path.join(work, "daemons.log"), "w")
    procs = [subprocess.Popen([os.path.join(BIN, "strata-master"), "--config", config, "--hosts",
                               os.path.join(work, "hosts"), "--summary",
                               os.path.join(work, "summary.json")], stdout=log, stderr=log)]
    for i in range(2):
        procs.append(subprocess.Popen(
            [os.path.join(BIN, "strata-pserver"), "--config", config, "--master",
             "127.0.0.1:%d" % port, "--index", str(i), "--port", "0", "--data_port", "0",
             "--http_port", "-1"], stdout=log, stderr=log))
    try:
        x = torch.rand(4096, 784)
        y = torch.randint(0, 10, (4096,))
        job = st.init(config=config, master="127.0.0.1:%d" % port, index=0)
        model = torch.nn.Module()
        sizes = [784, 256, 128, 10]
        names = []
        for i in range(3):
            w = torch.nn.Parameter(torch.zeros(sizes[i], sizes[i + 1]))
            b = torch.nn.Parameter(torch.zeros(sizes[i + 1]))
            model.register_parameter("w%d" % i, w)
            model.register_parameter("b%d" % i, b)
            names += [("fc%d.weight" % i, w), ("fc%d.bias" % i, b)]
        model.named_parameters = lambda *a, **k: iter(names)
        job.distribute(model)
        loss_fn = torch.nn.CrossEntropyLoss()
        tasks = job.tasks()
        left = [0]  # steps left in the task

        def next_batch():
            if left[0] == 0:
                left[0] = len(next(tasks)) // 64
            left[0] -= 1

        def forward_backward():
            idx = torch.randint(0, 4096, (64,))
            h = x[idx]
            for i in range(3):
                h = h @ getattr(model, "w%d" % i) + getattr(model, "b%d" % i)
                if i < 2:
                    h = torch.relu(h)
            loss_fn(h, y[idx]).backward()

        def measure(with_model):
            s0 = job.stats()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                next_batch()
                if with_model:
                    forward_backward()
                job.step(64)
            wall = time.perf_counter() - t0
            s1 = job.stats()
            comm = s1["comm_seconds"] - s0["comm_seconds"]
            return wall / args.steps * 1e6, comm / args.steps * 1e6

        measure(False)  # warm up
        rows = {"no model": [], "model": []}
        print("load average before: %s; %d cores" % (open("/proc/loadavg").read().split()[:3],
                                                       os.cpu_count()))
        print("%-9s %6s %12s %12s %14s" % ("round", "mode", "step us", "exchange us",
                                           "python us"))
        for r in range(args.rounds):
            for mode in ("no model", "model"):
                step, comm = measure(mode == "model")
                rows[mode].append((step, comm, step - comm))
                print("%-9d %-9s %9.0f %12.0f %14.0f" % (r + 1, mode, step, comm, step - comm))
        for mode, rs in rows.items():
            print("median %-9s step %.0f us, exchange %.0f us, outside the exchange %.0f us"
                  % (mode, statistics.median(r[0] for r in rs),
                     statistics.median(r[1] for r in rs), statistics.median(r[2] for r in rs)))
        job.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
