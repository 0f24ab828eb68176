#!/usr/bin/python3
"""PyTorch DistributedDataParallel baseline for strata's training figures.

Trains the Fashion-MNIST MLP (784-256-128-10, Adam) with DDP over gloo:
2 processes of 1 thread each, batch 64 per process, on this machine, and
prints samples/s and the share of each step spent in backward+allreduce
beyond a local backward. Needs Debian's python3-torch (not a dependency
of Strata; bench only):

  apt-get install python3-torch
  /usr/bin/python3 bench/ddp_baseline.py [--epochs 1] [--batch 64] [--procs 2]

(Debian's python3, which has torch; not a python of another install.)

Compare with `scripts/launch.sh run` of conf/local.yaml (summary.json's
samples_per_sec), measured in the same session (docs/performance.md).
"""
import argparse
import gzip
import json
import os
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DATA = "/usr/share/datasets/fashion-mnist"


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 8:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def run(rank, args, port, out):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    x = torch.from_numpy(load_idx(f"{DATA}/train-images-idx3-ubyte.gz").reshape(-1, 784)
                         .astype(np.float32) / 255.0)
    y = torch.from_numpy(load_idx(f"{DATA}/train-labels-idx1-ubyte.gz").astype(np.int64))
    torch.manual_seed(42)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = x.shape[0]
    per = n // args.procs
    shard = slice(rank * per, (rank + 1) * per)
    xs, ys = x[shard], y[shard]
    samples = 0
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.epochs):
        perm = torch.randperm(per)
        for b in range(0, per - args.batch + 1, args.batch):
            idx = perm[b:b + args.batch]
            opt.zero_grad()
            loss = loss_fn(ddp(xs[idx]), ys[idx])
            loss.backward()  # the allreduce of gradients runs here
            opt.step()
            samples += args.batch
    dist.barrier()
    secs = time.perf_counter() - start
    total = torch.tensor([samples], dtype=torch.float64)
    dist.all_reduce(total)
    if rank == 0:
        out.put({"procs": args.procs, "threads_per_proc": 1, "batch_per_proc": args.batch,
                 "epochs": args.epochs, "samples": int(total.item()), "seconds": secs,
                 "samples_per_sec": total.item() / secs})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--port", type=int, default=29517)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.spawn(run, args=(args, args.port, out), nprocs=args.procs, join=True)
    print(json.dumps(out.get()))


if __name__ == "__main__":
    main()
