"""A PyTorch script as a Strata worker (docs/python.md).

    import strata.torch as st
    job = st.init()                  # the launcher's STRATA_CONFIG, STRATA_MASTER, STRATA_INDEX
    model = job.distribute(MyNet())  # its parameters are the job's dense tables
    for records in job.tasks():      # record indices into the script's own dataset
        for batch in chunks(records):
            loss = ...; loss.backward()
            job.step(len(batch), loss=loss.item())
    job.finish(metrics={"test_accuracy": acc})

The worker core is Strata's C++ one (strata._core): registration,
heartbeats, task leases, bsp steps, retries and failover, progress reports.
The model's tensors alias the worker's memory: a pull lands in the
parameters in place and a push is sent from the gradients, with no copy.
"""

import os

import torch

from . import _core

_HOW_TO_LAUNCH = (
    "run the script as a worker of a Strata job (scripts/launch.sh starts it with "
    "STRATA_CONFIG, STRATA_MASTER and STRATA_INDEX set), or pass config=, master= and index="
)


def init(config=None, master=None, index=None, tls_dir=None):
    """Joins the job as a worker; returns the Job.

    Arguments default to what the launcher sets: STRATA_CONFIG (the job's
    config file), STRATA_MASTER (host:port), STRATA_INDEX (this worker's
    index), STRATA_TLS_DIR (an mtls cluster's certificates); and
    STRATA_HOST, STRATA_HTTP_PORT (the worker's status page and /metrics;
    -1 = none).
    """
    config = config if config is not None else os.environ.get("STRATA_CONFIG")
    master = master if master is not None else os.environ.get("STRATA_MASTER")
    if index is None:
        index = os.environ.get("STRATA_INDEX")
    if not config or not master or index is None:
        missing = [n for n, v in (("STRATA_CONFIG", config), ("STRATA_MASTER", master),
                                  ("STRATA_INDEX", index)) if not v and v != 0]
        raise RuntimeError("strata.torch.init(): not in a Strata cluster (%s not set): %s"
                           % (", ".join(missing), _HOW_TO_LAUNCH))
    try:
        index = int(index)
    except ValueError:
        raise ValueError("strata.torch.init(): STRATA_INDEX=%r is not a worker index" % index)
    tls_dir = tls_dir if tls_dir is not None else os.environ.get("STRATA_TLS_DIR", "")
    host = os.environ.get("STRATA_HOST", "127.0.0.1")
    http_port = int(os.environ.get("STRATA_HTTP_PORT", "-1"))
    return Job(_core.Worker(config, master, index, tls_dir, host, http_port))


class Job:
    """This process's part of a Strata job, as a worker."""

    def __init__(self, core):
        self._core = core
        self._tables = core.tables()
        self._grads = []
        self._finished = False

    @property
    def tables(self):
        """The job's tables: (name, shape) in order."""
        return [(name, tuple(shape)) for name, shape in self._tables]

    def distribute(self, model):
        """Makes the model's parameters the job's dense tables, in order.

        Each parameter must be float32 and contiguous, and have its table's
        shape; it is then a view of the worker's memory, into which the
        job's values are pulled (from the first task on: the model's own
        initial values are not used), and its gradient a view of the memory
        pushes are sent from.
        """
        params = list(model.named_parameters())
        if len(params) != len(self._tables):
            raise ValueError("the model has %d parameters, the job %d tables (%s)"
                             % (len(params), len(self._tables),
                                ", ".join(n for n, _ in self._tables)))
        self._grads = []
        for i, ((name, p), (table, shape)) in enumerate(zip(params, self._tables)):
            if p.dtype != torch.float32:
                raise TypeError("parameter %s is %s; Strata's tables are float32" % (name, p.dtype))
            if not p.is_contiguous():
                raise ValueError("parameter %s is not contiguous" % name)
            if tuple(p.shape) != tuple(shape):
                raise ValueError("parameter %s has shape %s, the job's table %d (%s) has %s"
                                 % (name, tuple(p.shape), i, table, tuple(shape)))
            values = torch.from_numpy(self._core.param(i)).view(p.shape)
            grad = torch.from_numpy(self._core.grad(i)).view(p.shape)
            p.data = values
            grad.zero_()
            p.grad = grad
            self._grads.append(grad)
        return model

    def tasks(self):
        """Data tasks leased from the master: each a tensor of record indices
        (int64) into the script's dataset, in training order. The
        parameters hold the task's first step's values when it is yielded.
        Ends when there is no more training for this worker."""
        while True:
            records = self._core.next_task()
            if records is None:
                return
            try:
                yield torch.from_numpy(records)
            finally:
                self._core.task_done()

    def step(self, batch_size, loss=0.0, correct=0):
        """One training step over `batch_size` records whose gradient (of the
        mean loss over them) autograd left in the parameters' .grad: pushed,
        then the next step's parameters pulled into the parameters in place
        (bsp: once every worker's step is applied). `loss` and `correct` go
        to the progress reports. The gradients are zeroed for the next step."""
        if not self._grads:
            raise RuntimeError("step() before distribute(model)")
        n = int(batch_size)
        with torch.no_grad():
            for g in self._grads:
                g.mul_(n)  # pushes carry the gradient summed over the batch
        self._core.step(n, float(loss) * n, int(correct))  # (reports take the batch's sum)
        with torch.no_grad():
            for g in self._grads:
                g.zero_()

    def finish(self, metrics=None):
        """Gives the final model's test figures ("test_accuracy",
        "test_loss", "test_auc") to the job's summary when this worker is
        the one asked to evaluate, and waits for the worker to end."""
        if self._finished:
            return
        self._finished = True
        self._core.finish({k: float(v) for k, v in (metrics or {}).items()})
        self._core.join()

    def close(self):
        """Leaves the job now, without waiting for it to end (the worker
        stops; a task it held goes back to the queue)."""
        self._finished = True
        self._core.stop()

    @property
    def node_id(self):
        return self._core.node_id
