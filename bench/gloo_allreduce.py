#!/usr/bin/python3
"""PyTorch's gloo allreduce timed among W processes on this host (TCP on
127.0.0.1, one thread each): the baseline of bench/allreduce_bench.sh,
which runs strata-allreduce-bench the same way beside it.

    /usr/bin/python3 bench/gloo_allreduce.py --ranks 4 --sizes 4K,1M,64M --iters 20

Each size: a barrier, `warmup` untimed allreduces, then `iters` timed ones
of a float32 tensor of that many bytes (dist.all_reduce, SUM). Prints one
JSON line per size from rank 0, as strata-allreduce-bench does.
"""
import argparse
import json
import os
import sys
import time


def parse_size(s):
    mult = {"K": 1024, "M": 1024 * 1024}.get(s[-1:], 1)
    n = int(s[:-1] if mult > 1 else s) * mult
    if n <= 0 or n % 4:
        raise ValueError(f"--sizes: '{s}' is not a size of floats")
    return n


def run(rank, args, sizes, port):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    for nbytes in sizes:
        buf = torch.full((nbytes // 4,), 1.0 + rank, dtype=torch.float32)
        dist.barrier()
        times = []
        for i in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        times.sort()
        median = times[len(times) // 2]
        if rank == 0:
            print(json.dumps({"impl": "gloo", "ranks": args.ranks, "bytes": nbytes,
                              "seconds": median,
                              "bus_gb_per_s": 2.0 * (args.ranks - 1) / args.ranks * nbytes
                              / median / 1e9}), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sizes", default="4K,64K,256K,1M,4M,16M,64M")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--port", type=int, default=0, help="the rendezvous port (0: from the pid)")
    args = p.parse_args()
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    except ValueError as e:
        sys.exit(f"gloo_allreduce.py: {e}")
    if args.ranks < 2 or args.iters < 1:
        sys.exit("gloo_allreduce.py: --ranks >= 2 and --iters >= 1")
    import torch.multiprocessing as mp
    port = args.port or 40000 + os.getpid() % 10000
    mp.spawn(run, args=(args, sizes, port), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
