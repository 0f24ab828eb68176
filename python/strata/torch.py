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

import functools
import os

import numpy as np
import torch

from . import _core

_HOW_TO_LAUNCH = (
    "run the script as a worker of a Strata job (scripts/launch.sh starts it with "
    "STRATA_CONFIG, STRATA_MASTER and STRATA_INDEX set), or pass config=, master= and index="
)


def config(path=None):
    """The job's config file (path, or STRATA_CONFIG) as a dict, before
    init(): a script loads its data first (the data section says where),
    then joins the job, so the job does not wait on the loading."""
    path = path if path is not None else os.environ.get("STRATA_CONFIG")
    if not path:
        raise RuntimeError("strata.torch.config(): not in a Strata cluster (STRATA_CONFIG not "
                           "set): " + _HOW_TO_LAUNCH)
    import yaml
    with open(path) as f:
        return yaml.safe_load(f)


def init(config=None, master=None, index=None, tls_dir=None):
    """Joins the job as a worker; returns the Job.

    Arguments default to what the launcher sets: STRATA_CONFIG (the job's
    config file), STRATA_MASTER (host:port; or several, comma-separated:
    a leader and its standbys, the worker follows the leader),
    STRATA_INDEX (this worker's
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
    job = Job(_core.Worker(config, master, index, tls_dir, host, http_port), config)
    job._worker_index = index
    _take_sigterm(job)
    return job


def _take_sigterm(job):
    """SIGTERM (a preemption notice: systemd, Slurm, launch.sh stop) is
    taken as strata-worker takes it: a checkpoint and a clean stop of the
    job are asked for while the script trains on, then tasks() ends and the
    script finishes (exit status 0). Only where the script left SIGTERM's
    default and from the main thread (Python's rule for handlers)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: job._core.preempt())


def tables_yaml(model, embeddings=None):
    """The model.tables entries (YAML) for a model's parameters, in order,
    and for sparse tables {name: dim} (embeddings): paste them into the
    config. A 1-d parameter (a bias) takes the fan_in of the parameter
    before it (its layer's weight), as PyTorch initialises it."""
    lines = []
    fan_in = 0
    for name, p in model.named_parameters():
        shape = list(p.shape)
        if len(shape) >= 2:
            fan_in = shape[1] * int(torch.tensor(shape[2:]).prod()) if len(shape) > 2 else shape[1]
            lines.append("    - {name: %s, shape: %s}" % (name, shape))
        elif fan_in:
            lines.append("    - {name: %s, shape: %s, fan_in: %d}" % (name, shape, fan_in))
        else:
            lines.append("    - {name: %s, shape: %s, init: zeros}" % (name, shape))
    for name, dim in (embeddings or {}).items():
        lines.append("    - {name: %s, dim: %d}" % (name, dim))
    return "\n".join(["  tables:"] + lines) + "\n"


class Job:
    """This process's part of a Strata job, as a worker."""

    def __init__(self, core, config_path=None):
        self._core = core
        self._config_path = config_path
        self._config = None
        self._tables = core.tables()  # (name, shape, dim)
        self._index = {name: i for i, (name, _, _) in enumerate(self._tables)}
        # Parameters not in the worker's memory (CUDA ones): (parameter,
        # its values' host copy, its gradient's host copy), and the stream
        # of the copies between them.
        self._staged = []
        self._stream = None
        # The parameters in the worker's memory: (table, parameter, its
        # gradient buffer); and the records of the backward() under way.
        self._direct = []
        self._backward_n = None
        self._begun = False
        self._begun_n = 0
        self._embeddings = {}
        self._finished = False
        self._shared = False  # this worker's part of declaring the tables is done
        # distribute(prefetch=True): its hooks, and whether a step's pulls
        # are still landing.
        self._prefetch = False
        self._hooks = []
        self._ahead = False
        self._worker_index = 0
        self._pipeline = None

    @property
    def config(self):
        """The job's config file as a dict (its data section says where the
        script's data is, job.batch_size the batch per worker)."""
        if self._config is None:
            self._config = globals()["config"](self._config_path)
        return self._config

    @property
    def batch_size(self):
        """The records of one step of the task being trained: the master's
        batch for it (elastic.batch fixed_global splits the job's global
        batch over the workers there are when the task is leased), else
        job.batch_size of the config. Read it for each task."""
        if self._core is not None:
            return int(self._core.batch_size())
        return int((self.config.get("job") or {}).get("batch_size", 64))

    @property
    def tables(self):
        """The job's tables in order: (name, shape) for a dense one,
        (name, dim) for a sparse one."""
        return [(name, tuple(shape)) if not dim else (name, dim)
                for name, shape, dim in self._tables]

    def distribute(self, model, prefetch=False, _stage=False):
        """Makes the model's parameters the job's dense tables, by name.

        Every parameter (model.named_parameters()) must be a dense table of
        the job of the same name and shape, float32 and contiguous, and
        every dense table a parameter. When the config lists no tables
        (model.tables), this declares them first: the model's parameters
        and the embeddings made so far are the job's tables, and the first
        worker's values their initial values (a different model is refused
        naming the table). On the CPU the parameter then is a
        view of the worker's memory, into which the job's values are
        pulled (from the first task on: the first worker's, or those the
        pservers initialised as model.tables says), and its gradient a
        view of the memory pushes are sent from. A CUDA parameter stays on its GPU: the worker's memory is its
        pinned host copy (cudaHostRegister), the gradient copied into it
        and the pulled values out of it on a side stream, the model's
        stream waiting for those copies only. Embeddings (job.embedding)
        inside the model are not parameters.

        prefetch=True (a model on the CPU): step() returns once its push is
        settled, the next step's values still landing in the parameters;
        each module's forward waits (a forward pre-hook) for its own
        parameters only, so the first layers compute while the last ones'
        values arrive, and once model(x) has returned all have landed.
        Only for scripts that read the parameters through model(...) alone:
        anything else reading them between step() and the next forward
        (a parameter used outside its module's forward, a norm logged)
        calls job.wait() first.
        """
        self.wait()  # (a previous distribute's pulls: landed before its hooks go)
        params = list(model.named_parameters())
        for name, p in params:  # (before a declaration: nothing refused after it)
            if p.dtype != torch.float32:
                raise TypeError("parameter %s is %s; Strata's tables are float32" % (name, p.dtype))
            if not p.is_contiguous():
                raise ValueError("parameter %s is not contiguous" % name)
            if p.device.type not in ("cpu", "cuda"):
                raise ValueError("parameter %s is on %s; distribute() takes a model on the CPU "
                                 "or on a CUDA device" % (name, p.device))
        declaring = self._core.declares_tables and not self._shared
        if declaring and not self._tables:
            self._declare(model)
        whose = ("declared by the job's first worker" if self._core.declares_tables
                 else "the config's model.tables")
        dense = {name: (i, tuple(shape)) for i, (name, shape, dim) in enumerate(self._tables)
                 if not dim}
        sparse = [name for name, _, dim in self._tables if dim]
        seen = set()
        self._staged = []
        self._direct = []
        for name, p in params:
            if name not in dense:
                if name in sparse:
                    raise ValueError("parameter %s: the job's table %s is sparse; look its rows "
                                     "up with job.embedding(%r)" % (name, name, name))
                raise ValueError("parameter %s (shape %s) is not a table of the job; its dense "
                                 "tables: %s (%s)"
                                 % (name, tuple(p.shape), ", ".join(dense) or "none", whose))
            i, shape = dense[name]
            if tuple(p.shape) != shape and not (p.dim() == 0 and shape == (1,)):
                raise ValueError("parameter %s has shape %s, the job's table %s has %s"
                                 % (name, tuple(p.shape), name, shape))
            seen.add(name)
            values = torch.from_numpy(self._core.param(i)).view(p.shape)
            grad = torch.from_numpy(self._core.grad(i)).view(p.shape)
            grad.zero_()
            if declaring:  # the model's own values: the job's if this worker is the first
                with torch.no_grad():
                    values.copy_(p.detach().to("cpu"))
            if p.device.type == "cpu" and not _stage:
                p.data = values
                p.grad = grad
                self._direct.append((i, p, grad))
                if p.requires_grad:  # (a frozen one's gradient stays zero)
                    p.register_hook(functools.partial(self._on_grad, i, grad))
            else:
                self._staged.append((p, values, grad))
        self._install_prefetch(model, prefetch)
        if any(p.device.type == "cuda" for p, _, _ in self._staged):
            self._stream = torch.cuda.Stream(device=self._staged[0][0].device)
            for _, values, grad in self._staged:
                for t in (values, grad):  # the copies' host side: pinned in place
                    _pin(t)
        missing = [name for name in dense if name not in seen]
        if missing:
            raise ValueError("the job's table %s is not a parameter of the model (its parameters: "
                             "%s)" % (missing[0], ", ".join(n for n, _ in params) or "none"))
        if declaring:
            # The first worker's values become the tables' (the others wait
            # for them); from the first task on every worker pulls them.
            self._core.share_initial_values()
            self._shared = True
        return model

    def pipeline(self, model, loss=None, input_shape=None, device=None):
        """Cuts an nn.Sequential into the job's model.stages pipeline
        stages (docs/python.md, "Pipeline stages"); returns the Pipeline,
        whose step(x, y) trains one batch through them.

        The modules are cut where the largest stage's parameters are
        fewest (each stage one module at least, a module of no parameters
        with the one before it); worker index i trains stage i % K, and
        only each group's first stage is given data tasks: the others
        compute their modules' micro-batches inside job.tasks(), which
        yields them no task. The model's parameters are made the job's
        tables first (distribute(model)): on the CPU, every stage's model
        holds them all, the pulls of its own stage landing in them (and
        every table's, for the worker that evaluates the final model).

        `loss(output, labels)`: the mean loss over a micro-batch's records
        (default torch.nn.functional.cross_entropy); labels are class
        indices. `input_shape`: one record's shape (default
        (model.layers[0],) for an MLP config), from which each stage's
        input and output shapes are worked out on the meta device. With
        model.stages 1, step() trains the whole model as usual.

        `device` (a CUDA device, say): this worker's stage computes on a
        copy of its modules there, the model staying whole on the CPU: each
        step's pulled values are copied to it from pinned host memory, and
        the gradient summed over the micro-batches back on a side stream;
        the micro-batches' rows go up and down with them. So one GPU holds
        one stage only. Not with model.stages 1."""
        if not isinstance(model, torch.nn.Sequential):
            raise TypeError("job.pipeline() cuts an nn.Sequential into stages; got %s"
                            % type(model).__name__)
        if self._pipeline is not None:
            raise RuntimeError("job.pipeline() was called already (one model per job)")
        for name, p in model.named_parameters():
            if p.device.type != "cpu":
                raise ValueError("parameter %s is on %s: a pipeline's model is on the CPU, "
                                 "whole (device= puts this worker's stage on a GPU)"
                                 % (name, p.device))
        if input_shape is None:
            layers = (self.config.get("model") or {}).get("layers")
            if not layers:
                raise ValueError("job.pipeline(): give input_shape, one record's shape (the "
                                 "config's model has no layers to take it from)")
            input_shape = (int(layers[0]),)
        # (Checked before distribute() declares anything: the script may
        # try again.)
        if device is not None:
            device = torch.device(device)
            if device.type == "cuda" and device.index is None:
                # (Resolved here: a later stage computes on the worker's
                # training thread, whose current device is 0.)
                device = torch.device("cuda", torch.cuda.current_device())
        pipe = Pipeline(self, model, loss or torch.nn.functional.cross_entropy,
                        tuple(int(d) for d in input_shape), device)
        self.distribute(model)
        pipe._make_stage()
        self._pipeline = pipe
        return pipe

    def _install_prefetch(self, model, prefetch):
        """distribute(prefetch=True): forward pre-hooks that wait for the
        pulls a step left landing, module by module (see distribute)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._prefetch = bool(prefetch) and not self._staged and bool(self._direct)
        if not self._prefetch:
            return
        table_of = {id(p): i for i, p, _ in self._direct}
        covered = set()
        for m in model.modules():
            if m is model or type(m).forward is torch.nn.Module.forward:
                continue  # (a container's parameters are used by another module's forward)
            # A module's forward may read its children's parameters without
            # calling them (nn.MultiheadAttention's out_proj): all of them.
            tables = [table_of[id(p)] for p in m.parameters() if id(p) in table_of]
            if tables:
                covered.update(tables)
                self._hooks.append(m.register_forward_pre_hook(
                    functools.partial(self._wait_tables, tables)))
        rest = [i for i, _, _ in self._direct if i not in covered]
        if rest:  # the model's own and its containers': before its forward starts
            self._hooks.append(model.register_forward_pre_hook(
                functools.partial(self._wait_tables, rest)))
        self._hooks.append(model.register_forward_hook(self._settle_after_forward))

    def _wait_tables(self, tables, module, inputs):
        if self._ahead and not self._core.preempted:
            self._core.wait_tables(tables)

    def _settle_after_forward(self, module, inputs, output):
        self.wait()

    def wait(self):
        """Waits for the values a step left landing (distribute(prefetch=
        True)): after it the parameters hold the next step's values."""
        if self._ahead:
            self._ahead = False
            if not self._core.preempted:  # (else the core cut them)
                self._core.settle_ahead()

    def _declare(self, model):
        """The job's tables are this model's (a config without
        model.tables): its parameters in named_parameters() order, then the
        embeddings made so far (job.embedding(name, dim)). The master takes
        the first worker's declaration and refuses a different one, naming
        the table."""
        tables = []
        for name, p in model.named_parameters():
            tables.append((name, [int(d) for d in p.shape] or [1], 0))
        for name, emb in self._embeddings.items():
            tables.append((name, [], emb.dim))
        self._core.declare(tables)
        self._tables = self._core.tables()
        self._index = {name: i for i, (name, _, _) in enumerate(self._tables)}
        for name, emb in self._embeddings.items():
            emb._table = self._index[name]

    def embedding(self, name, dim=None):
        """The sparse table `name` as a module: emb(ids) gives the rows of
        the ids (an int64 tensor of any shape; result shape ids.shape +
        (dim,)), pulled from the pservers; backward adds their gradient to
        the step's push. See Embedding.

        When the config declares no tables (no model.tables), the script
        does: give the row width `dim`, and make the embeddings before
        distribute(model), which declares them with the model's
        parameters. Otherwise `dim`, if given, must be the table's."""
        if self._core.declares_tables and not self._tables:
            if name in self._embeddings:
                emb = self._embeddings[name]
                if dim is not None and int(dim) != emb.dim:
                    raise ValueError("embedding %s has dim %d, not %s" % (name, emb.dim, dim))
                return emb
            if dim is None or int(dim) <= 0:
                raise ValueError("embedding %s: the config declares no tables, so the script "
                                 "does: give its row width, job.embedding(%r, dim=N)"
                                 % (name, name))
            self._embeddings[name] = Embedding(self._core, None, name, int(dim))
            return self._embeddings[name]
        if name not in self._index:
            if self._core.declares_tables:
                raise ValueError("no table %s in the job: make the embeddings before "
                                 "distribute(model), which declares the tables" % name)
            raise ValueError("no table %s in the job (its tables: %s)"
                             % (name, ", ".join(self._index)))
        i = self._index[name]
        if not self._tables[i][2]:
            raise ValueError("table %s is dense (shape %s): a parameter for distribute(), not an "
                             "embedding" % (name, tuple(self._tables[i][1])))
        if dim is not None and int(dim) != self._tables[i][2]:
            raise ValueError("embedding %s: dim %s, the job's table has dim %d"
                             % (name, dim, self._tables[i][2]))
        if name not in self._embeddings:
            self._embeddings[name] = Embedding(self._core, i, name, self._tables[i][2])
        return self._embeddings[name]

    def tasks(self):
        """Data tasks leased from the master: each a tensor of record indices
        (int64) into the script's dataset, in training order. The
        parameters hold the task's first step's values when it is yielded
        (in a pipeline, each step pulls its stage's tables instead). Ends
        when there is no more training for this worker. Leaving the
        loop mid-task (an exception, a break) fails the task: the worker
        stops (finish() raises) and the master requeues the task."""
        while True:
            if self._stream is not None:
                self._stream.synchronize()  # the copies from the host values: done before a pull
            records = self._core.next_task()
            if records is None:
                return
            self._values_to_device()
            try:
                yield torch.from_numpy(records)
            except GeneratorExit:
                # The loop was left mid-task (an exception, a break): the
                # task is not trained, so it is not completed; the master
                # requeues it once this worker has left.
                self._ahead = False
                self._core.leave_task()
                raise
            self._ahead = False  # (task_done settles the pulls left landing)
            if self._stream is not None:
                self._stream.synchronize()  # the last copies from the host values
            if self._begun:
                self._begun = False
                self._restore_grads()
                self._core.task_done()  # (fails the task: see the message)
                raise RuntimeError("job.backward() at the end of a data task was not followed "
                                   "by job.step(): the task fails")
            self._core.task_done()

    def backward(self, loss, batch_size):
        """loss.backward() with each parameter's gradient pushed to the
        pservers as autograd produces it, while the rest of the backward
        pass runs (the last layers' first); job.step(batch_size, ...) then
        sends what is left and settles the step. `loss` is the mean over
        the batch's `batch_size` records. The parameters' .grad hold the
        gradients afterwards (PyTorch's tensors, not the worker's memory,
        until step()): changing them (clipping) no longer changes what was
        pushed. A model on a GPU pushes at step() (its gradients are copied
        first). With model.dense_sync allreduce the workers' ring steps
        the dense tables together: its step begins here, and each bucket
        of gradients goes round as autograd completes it (the last layers'
        first); step() ends it."""
        if self._staged or not self._direct or self._core.preempted:
            loss.backward()
            return
        n = int(batch_size)
        self._ahead = False  # (the core settles the previous step's pulls first)
        self._core.begin_step(n)
        self._begun = True
        self._begun_n = n
        for _, p, _ in self._direct:
            p.grad = None  # autograd hands its tensor over; the hook copies it
        self._backward_n = n
        try:
            loss.backward()
        except BaseException:
            self._core.abandon_step()
            self._begun = False
            self._restore_grads()
            raise
        finally:
            self._backward_n = None

    def _on_grad(self, table, buf, grad):
        """A parameter's gradient, as autograd produces it: in backward(),
        times the batch size into the worker's memory and pushed."""
        n = self._backward_n
        if n is not None:
            torch.mul(grad, n, out=buf.view_as(grad))
            self._core.push_table(table)
        return None

    def _restore_grads(self):
        for _, p, buf in self._direct:
            p.grad = buf

    def step(self, batch_size=None, loss=0.0, correct=0):
        """One training step over `batch_size` records whose gradient (of the
        mean loss over them) autograd left in the parameters' .grad: pushed,
        then the next step's parameters pulled into the parameters in place
        (bsp: once every worker's step is applied). `loss` and `correct` go
        to the progress reports. The gradients are zeroed for the next step.
        `batch_size` defaults to backward()'s, else to job.batch_size.
        With model.dense_sync allreduce the dense gradients are summed over
        the workers' ring instead, and the parameters after the step land
        in place the same way (docs/python.md)."""
        if self._core.preempted:  # stopped by a preemption notice: the task ends here
            self._ahead = False
            if self._begun:  # its pushes are out: settled (or cut) by the core
                self._begun = False
                try:
                    self._core.step(self._begun_n, float(loss) * self._begun_n, int(correct))
                finally:
                    self._restore_grads()
            return
        if not self._direct and not self._staged and not self._embeddings:
            raise RuntimeError("step() before distribute(model) or job.embedding(name)")
        if batch_size is None:
            batch_size = self._begun_n if self._begun else self.batch_size
        n = int(batch_size)
        self._grads_from_device()
        # The core pushes the gradients times n (a push carries the sum over
        # its records) and zeroes them once sent; reports take the batch's
        # summed loss.
        self._ahead = False  # (the core settles the previous step's pulls first)
        try:
            self._core.step(n, float(loss) * n, int(correct), self._prefetch)
            self._ahead = self._prefetch
        finally:
            if self._begun:
                self._begun = False
                self._restore_grads()  # (zeroed by the core)
        self._values_to_device()

    def _grads_from_device(self):
        """The staged parameters' gradients into the worker's memory (the
        push reads them), each then zeroed on its device for the next
        backward."""
        if not self._staged:
            return
        _grads_to_host([(p, grad) for p, _, grad in self._staged], self._stream)
        with torch.no_grad():
            for p, _, _ in self._staged:
                if p.grad is not None:
                    p.grad.zero_()

    def _values_to_device(self):
        """The pulled values into the staged parameters."""
        if self._staged:
            _values_to_device([(p, values) for p, values, _ in self._staged], self._stream)

    @property
    def evaluating(self):
        """True once job.tasks() has ended when the job asks this worker for
        the final model's test figures (one worker is asked): compute them
        and give them to finish(). The others skip their test pass (their
        worker has left the job: a lookup would fail)."""
        return self._core.evaluating

    def finish(self, metrics=None):
        """Gives the final model's test figures ("test_accuracy",
        "test_loss", "test_auc", "test_examples") to the job's summary when
        this worker is the one asked (job.evaluating), and waits for the
        worker to end."""
        if self._finished:
            return
        self._finished = True
        self._core.finish({k: float(v) for k, v in (metrics or {}).items()})
        self._core.join()

    def close(self):
        """Leaves the job now, without waiting for it to end (the worker
        stops; a task it held goes back to the queue)."""
        self._finished = True
        self._ahead = False
        self._core.stop()

    def stats(self):
        """This worker's step counters: steps, samples, busy_seconds (its
        steps' wall time) and comm_seconds (the part spent in exchanges
        with the pservers)."""
        return self._core.stats()

    @property
    def node_id(self):
        return self._core.node_id


def _grads_to_host(pairs, stream):
    """(device parameter, gradient in the worker's memory) pairs: each
    parameter's gradient copied into the worker's memory (zeros where it
    has none: not used by the step), on the side `stream` after the
    model's work (None: at once), waited for (a push reads them next)."""
    with torch.no_grad():
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(stream.device))
            with torch.cuda.stream(stream):
                for p, grad in pairs:
                    if p.grad is None:
                        grad.zero_()
                    else:
                        grad.view_as(p).copy_(p.grad, non_blocking=True)
            stream.synchronize()
        else:
            for p, grad in pairs:
                if p.grad is None:
                    grad.zero_()
                else:
                    grad.view_as(p).copy_(p.grad)


def _values_to_device(pairs, stream):
    """(device parameter, its values in the worker's memory) pairs: the
    pulled values into the parameters, on the side `stream` (None: at
    once), the model's stream waiting for it (not this thread). The host
    values are rewritten by the next pull only after the next step's push,
    which _grads_to_host's synchronise precedes."""
    with torch.no_grad():
        if stream is not None:
            with torch.cuda.stream(stream):
                for p, values in pairs:
                    p.copy_(values.view_as(p), non_blocking=True)
            torch.cuda.current_stream(stream.device).wait_stream(stream)
        else:
            for p, values in pairs:
                p.copy_(values.view_as(p))


def _pin(t):
    """Pins a tensor of the worker's memory in place (cudaHostRegister), for
    asynchronous copies to and from the GPU. Memory already pinned (a
    small table on a page another one pinned) stays so; any other failure
    raises, naming it."""
    cudart = torch.cuda.cudart()
    r = cudart.cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
    code = int(getattr(r, "value", r))
    if code not in (0, 712):  # success, cudaErrorHostMemoryAlreadyRegistered
        cudart.cudaGetLastError()
        raise RuntimeError("cudaHostRegister of %d bytes of the worker's memory failed: CUDA "
                           "error %d" % (t.numel() * t.element_size(), code))
    if code != 0:
        cudart.cudaGetLastError()  # (not left for the next kernel launch to report)


def _stage_shapes(modules, input_shape):
    """Each module's input shape and the last one's output shape, for one
    record, worked out on the meta device (no memory, no compute)."""
    try:
        from torch.func import functional_call
    except ImportError:  # (torch before 2.0)
        from torch.nn.utils.stateless import functional_call
    # (2 records: a batch norm in training mode refuses 1.)
    x = torch.empty((2,) + tuple(input_shape), device="meta")
    shapes = [tuple(x.shape[1:])]
    for i, m in enumerate(modules):
        buffers = [n for n, _ in m.named_buffers()]
        if buffers:
            raise ValueError("job.pipeline(): module %d (%s) keeps buffers (%s), which are not "
                             "tables: pipeline stages do not share or save them yet"
                             % (i, type(m).__name__, ", ".join(buffers)))
        meta = {n: torch.empty_like(t, device="meta")
                for n, t in list(m.named_parameters()) + list(m.named_buffers())}
        try:
            with torch.no_grad():
                x = functional_call(m, meta, (x,))
        except Exception as e:
            raise ValueError("job.pipeline(): module %d (%s) does not take an input of shape %s "
                             "(input_shape %s): %s" % (i, type(m).__name__, shapes[-1],
                                                       tuple(input_shape), e))
        if not isinstance(x, torch.Tensor):
            raise TypeError("job.pipeline(): module %d (%s) returns %s, not one tensor"
                            % (i, type(m).__name__, type(x).__name__))
        shapes.append(tuple(x.shape[1:]))
    return shapes


class Pipeline:
    """This worker's part of a pipeline of model.stages stages
    (job.pipeline): step(x, y) on the first stage's worker."""

    def __init__(self, job, model, loss, input_shape, device=None):
        self._job = job
        self._device = device
        self._core = job._core
        self._model = model
        self._loss = loss
        self.stages = int(self._core.stages)
        modules = list(model.children())
        config = job._config_path or "the job's config"
        if self.stages > len(modules):
            raise ValueError("%s: model.stages is %d but the nn.Sequential has %d modules: each "
                             "stage needs one at least" % (config, self.stages, len(modules)))
        self._shapes = shapes = _stage_shapes(modules, input_shape)
        self.stage = 0
        if self.stages == 1:
            if device is not None:
                raise ValueError("job.pipeline(device=%s): model.stages is 1 in %s; move the "
                                 "model itself (distribute() takes a CUDA model)"
                                 % (device, config))
            return
        costs = [sum(p.numel() for p in m.parameters()) for m in modules]
        self.bounds = bounds = _core.cut_stages(costs, self.stages)
        for k in range(self.stages):  # (every worker refuses the same cut)
            if not any(costs[bounds[k]:bounds[k + 1]]):
                raise ValueError("%s: model.stages %d: stage %d (modules %d..%d) has no "
                                 "parameters to train: fewer stages"
                                 % (config, self.stages, k, bounds[k], bounds[k + 1] - 1))
        self.stage = s = job._worker_index % self.stages
        lo, hi = bounds[s], bounds[s + 1]
        self._modules = torch.nn.Sequential(*modules[lo:hi])
        self._first_in_dim = int(np.prod(shapes[0], dtype=np.int64))

    def _make_stage(self):
        """The stage, once the model's parameters are the job's tables:
        handed to the worker core, which steps it."""
        if self.stages == 1:
            return
        s, lo, hi = self.stage, self.bounds[self.stage], self.bounds[self.stage + 1]
        names = {id(p): name for name, p in self._model.named_parameters()}
        tables = sorted(self._job._index[names[id(p)]] for p in self._modules.parameters())
        if tables != list(range(tables[0], tables[-1] + 1)):
            raise ValueError("stage %d's parameters are not consecutive tables of the job (%s): "
                             "the tables must be in the model's order" % (s, tables))
        in_dim = int(np.prod(self._shapes[lo], dtype=np.int64))
        out_dim = int(np.prod(self._shapes[hi], dtype=np.int64))
        self._stage = _Stage(self._modules, self._shapes[lo], self._loss, first=s == 0,
                             last=s + 1 == self.stages, device=self._device)
        self._core.set_stage(self._stage, s, tables[0], tables[-1] + 1, in_dim, out_dim,
                             "modules %d..%d" % (lo, hi - 1))
        import atexit
        atexit.register(self._core.detach_stage)

    @property
    def micro_batches(self):
        return int(self._core.micro_batches)

    def step(self, x, y):
        """One training step of the batch x (records, each of the pipeline's
        input_shape) with labels y (class indices) through the stages, in
        micro-batches scheduled one-forward-one-backward; each stage's
        gradient summed over them is pushed for the step, so the step is the
        unpipelined one (float rounding apart). Returns (the batch's mean
        loss, the records predicted right). On the first stage's worker,
        in a data task (job.tasks())."""
        n = len(y)
        if n == 0:
            raise ValueError("pipeline step of no records")
        if len(x) != n:
            raise ValueError("pipeline step of %d records and %d labels" % (len(x), n))
        if self.stages == 1:
            out = self._model(x)
            loss = self._loss(out, y)
            self._job.backward(loss, n)
            correct = int((out.argmax(1) == y).sum()) if out.dim() == 2 else 0
            self._job.step(n, loss=loss.item(), correct=correct)
            return loss.item(), correct
        if self.stage != 0:
            raise RuntimeError("pipeline stage %d: only the first stage steps on data (its "
                               "worker is given the tasks)" % self.stage)
        xs = x.detach().to("cpu", torch.float32).reshape(n, -1).contiguous()
        if xs.shape[1] != self._first_in_dim:
            raise ValueError("pipeline step: records of %d values, the pipeline's input_shape "
                             "makes %d" % (xs.shape[1], self._first_in_dim))
        ys = y.detach().to("cpu", torch.int32).contiguous()
        summed, correct = self._core.pipeline_step(xs.numpy(), ys.numpy())
        return summed / n, correct


class _Stage:
    """A stage's modules, as the worker core calls them (python/core.cc's
    PyStage): each micro-batch's forward pass keeps its autograd graph
    until its backward pass (1F1B keeps at most K - s of them in flight);
    the last stage does both at once, from the loss. The gradients add up
    in the parameters' .grad: on the CPU the worker's memory itself, pushed
    after the step; on a device (job.pipeline(device=...)) a copy of the
    modules there, whose values come from the worker's memory at each step
    and whose gradients go back to it at its end."""

    def __init__(self, modules, in_shape, loss, first, last, device=None):
        self._in_shape = tuple(in_shape)
        self._loss = loss
        self._first = first
        self._last = last
        self._kept = {}
        self._device = device
        self._stream = None
        # (host values, host gradient) of each parameter: the worker's
        # memory, which the CPU modules' parameters alias.
        host = [(p.data, p.grad) for p in modules.parameters()]
        if device is None:
            self._modules = modules
        else:
            import copy
            self._modules = copy.deepcopy(modules).to(device)
            if device.type == "cuda":
                self._stream = torch.cuda.Stream(device=device)
                for values, grad in host:  # the copies' host side: pinned in place
                    for t in (values, grad):
                        _pin(t)
        self._params = list(self._modules.parameters())
        self._host = host

    def _input(self, x):
        t = torch.from_numpy(x).view((x.shape[0],) + self._in_shape).clone()
        if self._device is not None:
            t = t.to(self._device)
        if not self._first:
            t.requires_grad_()
        return t

    def begin_step(self):
        self._kept.clear()
        with torch.no_grad():
            if self._device is None:
                # The gradients add up in the worker's memory: made .grad
                # again (a zero_grad(set_to_none=True) lets it go).
                for p, (_, grad) in zip(self._params, self._host):
                    grad.zero_()
                    p.grad = grad.view_as(p)
                return
            for p in self._params:
                if p.grad is not None:
                    p.grad.zero_()
        _values_to_device([(p, values) for p, (values, _) in zip(self._params, self._host)],
                          self._stream)

    def forward(self, m, x, out):
        inp = self._input(x)
        with torch.enable_grad():
            y = self._modules(inp)
        self._kept[m] = (inp, y)
        with torch.no_grad():
            torch.from_numpy(out).copy_(y.reshape(out.shape))

    def backward(self, m, x, labels, out_grad, in_grad):
        with torch.enable_grad():
            if labels is not None:  # the last stage: the loss's
                inp = self._input(x)
                out = self._modules(inp)
                y = torch.from_numpy(labels).long()
                if self._device is not None:
                    y = y.to(self._device)
                loss = self._loss(out, y)
                (loss * len(y)).backward()
                summed = float(loss) * len(y)
                correct = int((out.argmax(1) == y).sum()) if out.dim() == 2 else 0
            else:
                inp, out = self._kept.pop(m)
                g = torch.from_numpy(out_grad).view(out.shape)
                out.backward(g if self._device is None else g.to(self._device))
                summed, correct = 0.0, 0
        if in_grad is not None:
            with torch.no_grad():
                torch.from_numpy(in_grad).copy_(inp.grad.reshape(in_grad.shape))
        return summed, correct

    def end_step(self):
        self._kept.clear()
        if self._device is not None:  # the summed gradients into the worker's memory
            _grads_to_host([(p, grad) for p, (_, grad) in zip(self._params, self._host)],
                           self._stream)


class _Lookup(torch.autograd.Function):
    """rows = table[ids]; backward adds the rows' gradient, summed per
    distinct id, to the step's push of the table."""

    @staticmethod
    def forward(ctx, anchor, emb, ids):
        flat = ids.reshape(-1)
        unique, inverse = torch.unique(flat, sorted=False, return_inverse=True)
        rows = torch.from_numpy(emb._core.lookup(emb._table, unique.numpy().view(np.uint64)))
        ctx.emb = emb
        ctx.save_for_backward(unique, inverse)
        out = rows[inverse].reshape(tuple(ids.shape) + (emb.dim,))
        return out if emb._device is None else out.to(emb._device, non_blocking=True)

    @staticmethod
    def backward(ctx, grad):
        unique, inverse = ctx.saved_tensors
        emb = ctx.emb
        if unique.numel() > 0:
            summed = torch.zeros(unique.numel(), emb.dim, dtype=torch.float32)
            summed.index_add_(0, inverse, grad.reshape(-1, emb.dim).to("cpu", torch.float32))
            emb._core.add_row_grads(emb._table, unique.numpy().view(np.uint64),
                                    summed.contiguous().numpy())
        return None, None, None


class Embedding(torch.nn.Module):
    """A sparse table of the job (job.embedding(name)): emb(ids) gives the
    rows of `ids` (int64 or int32, any shape; an id is an unsigned 64-bit
    key, so a negative one is 2^64 + id, as hashed keys are) as a float32
    tensor of shape
    ids.shape + (dim,). In a data task the rows are those of the step being
    computed (bsp: every worker's previous step applied); outside one, the
    latest. The rows' gradient (backward) is summed per distinct id and
    pushed with job.step(); the table's optimizer (sparse.optimizer) runs on
    the pservers."""

    def __init__(self, core, table, name, dim):
        super().__init__()
        self._core = core
        self._table = table
        self.name = name
        self.dim = dim
        # The Function's backward runs only when an input requires grad:
        # this empty tensor is that input (not a parameter of the model).
        self._anchor = torch.empty(0, requires_grad=True)
        self._device = None

    def forward(self, ids):
        if not isinstance(ids, torch.Tensor):
            raise TypeError("embedding %s: ids must be a tensor of int64, got %s"
                            % (self.name, type(ids).__name__))
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError("embedding %s: ids must be int64 (or int32), got %s"
                            % (self.name, ids.dtype))
        if self._table is None:
            raise RuntimeError("embedding %s is not a table of the job yet: distribute(model) "
                               "declares it" % self.name)
        # Rows are pulled into host memory; on a GPU they go to the ids'
        # device, their gradient comes back to the host.
        self._device = ids.device if ids.device.type != "cpu" else None
        ids = ids.to("cpu", torch.int64).contiguous()
        return _Lookup.apply(self._anchor, self, ids)

    def extra_repr(self):
        return "%s, dim=%d" % (self.name, self.dim)
