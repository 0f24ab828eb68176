#!/usr/bin/python3
"""distribute(prefetch=True) against waiting for the pulls in step()
(docs/performance.md, issue 25).

The CNN of examples/torch/fmnist_cnn.py (conf/torch-cnn.yaml's model:
tables declared by the script) trained by 2 pservers and 2 script workers
(bsp, batch 32 each) on the first --records records of Fashion-MNIST, one
epoch; a job without prefetch and one with it, alternated for --rounds
rounds. A cluster is a master and pservers from build/bin (plaintext,
127.0.0.1; tests/python/conftest.py's).

    /usr/bin/python3 bench/torch_prefetch_bench.py [--rounds 3] [--records 19200]

Prints samples/s of each job (records over the job's wall time) and the
ratio with/without, per round and the median.
"""

import argparse
import os
import statistics
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def worker():
    """One worker of the job (run by the launcher side below)."""
    sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))
    import torch
    import strata.torch as st
    from fmnist_cnn import Net, load
    torch.set_num_threads(1)
    data = st.config()["data"]
    x, y = load(data["train_images"], data["train_labels"])
    job = st.init()
    torch.manual_seed(0)
    model = job.distribute(Net(), prefetch=os.environ["STRATA_BENCH_PREFETCH"] == "1")
    loss_fn = torch.nn.CrossEntropyLoss()
    for records in job.tasks():
        for b in range(0, len(records), 32):
            idx = records[b:b + 32]
            loss = loss_fn(model(x[idx]), y[idx])
            job.backward(loss, len(idx))
            job.step(len(idx), loss=loss.item())
    job.finish(metrics={"test_accuracy": 0.0})


def job(prefetch, records):
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    from conftest import Cluster
    c = Cluster(tempfile.mkdtemp(prefix="strata-prefetch-"), workers=2, pservers=2,
                model="model:\n  type: script", steps_records=records, batch_size=32,
                learning_rate=0.001, extra="worker:\n  command: [/usr/bin/python3, x.py]\n")
    try:
        ws = [c.worker(i, [sys.executable, os.path.abspath(__file__), "--worker"],
                       env={"STRATA_BENCH_PREFETCH": "1" if prefetch else "0"})
              for i in range(2)]
        summary = c.wait_summary(timeout=900)
        for w in ws:
            w.wait(timeout=60)
    finally:
        c.stop()
    if summary.get("state") != "succeeded":
        raise SystemExit("the job did not succeed: %s (logs in %s)" % (summary, c.dir))
    return records / summary["wall_seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=19200)
    a = ap.parse_args()
    if a.worker:
        return worker()
    os.environ.setdefault("STRATA_BIN", os.path.join(ROOT, "build", "bin"))
    ratios = []
    for r in range(a.rounds):
        without = job(False, a.records)
        with_ = job(True, a.records)
        ratios.append(with_ / without)
        print("round %d: without %.0f | with prefetch %.0f samples/s | ratio %.3f"
              % (r + 1, without, with_, ratios[-1]), flush=True)
    print("median ratio %.3f" % statistics.median(ratios))


if __name__ == "__main__":
    main()
