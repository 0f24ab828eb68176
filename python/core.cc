// strata._core: the worker core for a Python training script (docs/python.md).
// A Worker registers with the master, heartbeats and leases data tasks as
// the C++ worker does (worker/worker.h), on threads of its own; its
// ScriptTrainer (worker/script_trainer.h) hands the script each task's
// records and runs each step the script asks for. The script's tensors
// alias the worker's parameter and gradient memory (numpy arrays over it),
// so nothing is copied between them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/daemon_env.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "transport/transport_config.h"
#include "worker/pipeline.h"
#include "worker/worker.h"

namespace py = pybind11;

namespace strata::python {
namespace {

void ThrowIfError(const absl::Status& s) {
  if (s.ok()) return;
  if (absl::IsInvalidArgument(s)) throw py::value_error(std::string(s.message()));
  throw std::runtime_error(std::string(s.message()));
}

// A pipeline stage computed by the script (strata.torch's _Stage): its
// methods called with the GIL taken, from the thread that steps the stage
// (the script's own for the leader, the worker's training thread for a
// stage after the first, while the script waits in job.tasks()). The
// micro-batches' rows are numpy views of the worker's buffers, valid
// during the call only. `stage` is borrowed: the PyWorker holds it.
class PyStage : public worker::StageModel {
 public:
  PyStage(PyObject* stage, int in_dim, int out_dim, const std::vector<std::vector<float>>* grads)
      : stage_(stage), in_dim_(in_dim), out_dim_(out_dim), grads_(grads) {}
  int in_dim() const override { return in_dim_; }
  int out_dim() const override { return out_dim_; }
  // The script has ended (atexit): no call goes to it any more.
  void Detach() { detached_ = true; }

  absl::Status BeginStep() override {
    return Call("begin_step", [&](py::handle s) { s.attr("begin_step")(); });
  }
  absl::Status Forward(uint32_t m, const float* x, int rows, float* out) override {
    return Call("forward", [&](py::handle s) {
      s.attr("forward")(m, View(x, rows, in_dim_), View(out, rows, out_dim_));
    });
  }
  absl::StatusOr<double> Backward(uint32_t m, const float* x, const int32_t* y, int rows,
                                  const float* out_grad, float* in_grad, bool accumulate,
                                  int64_t* correct) override {
    double loss = 0;
    absl::Status s = Call("backward", [&](py::handle st) {
      py::object labels = py::none();
      if (out_grad == nullptr) {
        labels =
            py::array_t<int32_t>({static_cast<py::ssize_t>(rows)}, {sizeof(int32_t)}, y, Keep(y));
      }
      py::tuple r = st.attr("backward")(
          m, View(x, rows, in_dim_), labels,
          out_grad != nullptr ? py::object(View(out_grad, rows, out_dim_)) : py::none(),
          in_grad != nullptr ? py::object(View(in_grad, rows, in_dim_)) : py::none());
      loss = r[0].cast<double>();
      *correct = r[1].cast<int64_t>();
    });
    if (!s.ok()) return s;
    return loss;
  }
  absl::StatusOr<const std::vector<std::vector<float>>*> Summed() override {
    STRATA_RETURN_IF_ERROR(Call("end_step", [&](py::handle s) { s.attr("end_step")(); }));
    return grads_;
  }

 private:
  static py::capsule Keep(const void* p) {
    return py::capsule(p, [](void*) {});  // (the buffer is the worker's)
  }
  static py::array View(const float* p, int rows, int dim) {
    return py::array_t<float>(
        {static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(dim)},
        {static_cast<py::ssize_t>(dim * sizeof(float)), static_cast<py::ssize_t>(sizeof(float))}, p,
        Keep(p));
  }
  // Runs `body` on the stage with the GIL held; what it raises becomes
  // the step's error, naming the method.
  template <typename F>
  absl::Status Call(const char* method, F body) {
    if (detached_) return absl::CancelledError("the training script has ended");
    py::gil_scoped_acquire gil;
    if (detached_) return absl::CancelledError("the training script has ended");
    try {
      body(py::handle(stage_));
      return absl::OkStatus();
    } catch (py::error_already_set& e) {
      return absl::InternalError(absl::StrCat("the training script's pipeline stage raised in ",
                                              method, "(): ", e.what()));
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("the training script's pipeline stage, in ", method, "(): ", e.what()));
    }
  }

  PyObject* const stage_;
  const int in_dim_, out_dim_;
  const std::vector<std::vector<float>>* const grads_;
  std::atomic<bool> detached_{false};
};

class PyWorker {
 public:
  PyWorker(const std::string& config, const std::string& master, int index,
           const std::string& tls_dir, const std::string& host, int http_port) {
    DaemonEnvOptions eo("worker", index, config, tls_dir, ::getenv);
    int code = 0;
    absl::StatusOr<DaemonEnv> env = LoadDaemonEnv(eo, &code);
    ThrowIfError(env.status());
    env_ = std::make_unique<DaemonEnv>(*std::move(env));
    worker::WorkerOptions o;
    o.config = env_->config;
    o.master_address = master;
    o.index = index;
    o.host = host;
    o.http_port = http_port >= -1 ? http_port : env_->config.cluster.ports.worker_http + index;
    o.transport = transport::TransportOptionsFor(env_->config.cluster);
    o.fs = env_->fs.get();
    o.security = env_->security;
    o.script = true;
    // strata-worker --trace passes its trace file on (worker_main.cc).
    if (const char* trace = ::getenv("STRATA_TRACE"); trace != nullptr && *trace != '\0') {
      o.trace_path = trace;
      if (const char* max = ::getenv("STRATA_TRACE_MAX_STEPS"); max != nullptr) {
        o.trace_max_steps = std::atoll(max);
      }
    }
    absl::StatusOr<std::unique_ptr<worker::Worker>> w = worker::Worker::Create(std::move(o));
    ThrowIfError(w.status());
    worker_ = *std::move(w);
    script_ = worker_->script_trainer();
    {
      py::gil_scoped_release release;
      ThrowIfError(worker_->Start());
    }
    run_ = std::thread([this] {
      status_ = worker_->Run();
      script_->Close(status_);
      run_done_.Notify();
    });
  }
  ~PyWorker() { Stop(); }

  // (name, shape, dim): a dense table's shape with dim 0, or a sparse
  // table's row width with an empty shape.
  std::vector<std::tuple<std::string, std::vector<uint64_t>, int>> Tables() const {
    std::vector<std::tuple<std::string, std::vector<uint64_t>, int>> out;
    for (const TableSpec& t : script_->tables()) out.emplace_back(t.name, t.shape, t.dim);
    return out;
  }

  // The rows of sparse table `table` for distinct keys (uint64), as a new
  // float32 array {n, dim}.
  py::array_t<float> Lookup(int table, py::array_t<uint64_t, py::array::c_style> keys) {
    const int dim = TableDim(table);
    const size_t n = static_cast<size_t>(keys.size());
    py::array_t<float> rows({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(dim)});
    float* out = rows.mutable_data();
    const uint64_t* k = keys.data();
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = script_->Lookup(static_cast<uint32_t>(table), k, n, out);
    }
    ThrowIfError(s);
    return rows;
  }
  void AddRowGrads(int table, py::array_t<uint64_t, py::array::c_style> keys,
                   py::array_t<float, py::array::c_style> grads) {
    const int dim = TableDim(table);
    const size_t n = static_cast<size_t>(keys.size());
    if (static_cast<size_t>(grads.size()) != n * dim) {
      throw py::value_error(absl::StrCat("table ", script_->tables()[table].name, ": ", n,
                                         " keys and ", grads.size(), " gradient values (dim ", dim,
                                         ")"));
    }
    ThrowIfError(script_->AddRowGrads(static_cast<uint32_t>(table), keys.data(), n, grads.data()));
  }
  uint32_t node_id() const { return worker_->node_id(); }

  // The config has no model.tables: the script declares them (Declare).
  bool DeclaresTables() const { return ScriptDeclaresTables(env_->config.model); }
  // The script's model as the job's tables, (name, shape, dim) each: dense
  // with dim 0, sparse with an empty shape (Worker::DeclareTables).
  void Declare(const std::vector<std::tuple<std::string, std::vector<uint64_t>, int>>& tables) {
    std::vector<TableSpec> specs;
    for (const auto& [name, shape, dim] : tables) {
      TableSpec t;
      t.name = name;
      t.shape = shape;
      t.sparse = dim > 0;
      t.dim = dim;
      t.init = t.sparse ? "" : "worker";
      specs.push_back(std::move(t));
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = worker_->DeclareTables(std::move(specs));
    }
    ThrowIfError(s);
  }
  // Worker::ShareInitialValues: the values in param(i) are this worker's
  // model's; returns once the job's tables hold the first worker's.
  void ShareInitialValues() {
    absl::Status s;
    while (true) {
      {
        py::gil_scoped_release release;
        s = worker_->ShareInitialValues(absl::Now() + absl::Milliseconds(500));
      }
      if (!absl::IsDeadlineExceeded(s)) break;
      // The script's signal handlers (SIGTERM) run while it waits.
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    if (!s.ok() && preempted_) return;  // stopped: tasks() ends at once
    ThrowIfError(s);
  }

  // Table i's parameters (or gradient), as a flat float32 array over the
  // worker's own memory; `self` keeps the worker alive while it is used.
  static py::array View(py::object self, int i, bool grad) {
    PyWorker& w = self.cast<PyWorker&>();
    auto& tensors = grad ? const_cast<std::vector<std::vector<float>>&>(w.script_->grads())
                         : w.script_->params();
    if (i < 0 || i >= static_cast<int>(tensors.size())) {
      throw py::index_error(absl::StrCat("table ", i, " of ", tensors.size()));
    }
    std::vector<float>& v = tensors[i];
    return py::array_t<float>({static_cast<py::ssize_t>(v.size())}, {sizeof(float)}, v.data(),
                              self);
  }

  int TableDim(int table) const {
    const auto& tables = script_->tables();
    if (table < 0 || table >= static_cast<int>(tables.size())) {
      throw py::index_error(absl::StrCat("table ", table, " of ", tables.size()));
    }
    if (!tables[table].sparse) {
      throw py::value_error(absl::StrCat("table ", tables[table].name, " is dense, not sparse"));
    }
    return tables[table].dim;
  }

  py::object NextTask() {
    absl::StatusOr<std::optional<std::vector<int64_t>>> task;
    while (true) {
      {
        py::gil_scoped_release release;
        task = script_->NextTask(absl::Milliseconds(200));
      }
      if (!absl::IsDeadlineExceeded(task.status())) break;
      // Runs the script's signal handlers (SIGTERM: the preemption
      // notice) while the worker waits for a task.
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    if (!task.ok() && preempted_) return py::none();
    ThrowIfError(task.status());
    if (!task->has_value()) return py::none();
    std::vector<int64_t>& order = **task;
    py::array_t<int64_t> out(static_cast<py::ssize_t>(order.size()));
    std::copy(order.begin(), order.end(), out.mutable_data());
    return std::move(out);
  }

  int BatchSize() const { return script_->batch_size(); }

  // Pipeline stages (model.stages): the script's stage object (torch.py's
  // _Stage), which computes stage `stage` of tables [first, end).
  void SetStage(py::object stage, int index, int first, int end, int in_dim, int out_dim,
                const std::string& layers) {
    if (py_stage_ != nullptr) {
      throw std::runtime_error(
          "this worker's pipeline stage is made already (job.pipeline() once a worker)");
    }
    auto model = std::make_shared<PyStage>(stage.ptr(), in_dim, out_dim, &script_->grads());
    ThrowIfError(script_->SetStage(index, first, end, model, layers));
    stage_obj_ = std::move(stage);
    py_stage_ = std::move(model);
  }
  // The script has ended (atexit): its stage is called no more.
  void DetachStage() {
    if (py_stage_ != nullptr) py_stage_->Detach();
  }
  int Stages() const { return env_->config.model.stages; }
  int MicroBatches() const { return script_->micro_batches(); }
  // The leader's step: x (n rows, flat) and labels y through the stages.
  std::tuple<double, int64_t> PipelineStep(py::array_t<float, py::array::c_style> x,
                                           py::array_t<int32_t, py::array::c_style> y) {
    const int n = static_cast<int>(y.size());
    if (n <= 0 || x.size() % n != 0) {
      throw py::value_error(absl::StrCat("a pipeline step of ", x.size(), " inputs and ", n,
                                         " labels: the inputs are not n rows"));
    }
    double loss = 0;
    int64_t correct = 0;
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = script_->PipelineStep(x.data(), y.data(), n, &loss, &correct);
    }
    if (!s.ok() && preempted_) return {0.0, 0};  // stopped for the preemption: the task ends
    ThrowIfError(s);
    return {loss, correct};
  }

  void Step(int n, double loss, int64_t correct, bool ahead) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = script_->Step(n, loss, correct, ahead);
    }
    if (!s.ok() && preempted_) return;  // stopped for the preemption: the task ends
    ThrowIfError(s);
  }

  // ScriptTrainer::WaitTables / SettleAhead (the pulls a step left landing).
  // (Stopped by a preemption notice: the pulls were cut, the task ends.)
  void WaitTables(const std::vector<uint32_t>& tables) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = script_->WaitTables(tables);
    }
    if (!s.ok() && preempted_) return;
    ThrowIfError(s);
  }
  void SettleAhead() {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = script_->SettleAhead();
    }
    if (!s.ok() && preempted_) return;
    ThrowIfError(s);
  }
  void BeginStep(int n) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = script_->BeginStep(n);
    }
    ThrowIfError(s);
  }
  void PushTable(int table) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = script_->PushTable(static_cast<uint32_t>(table));
    }
    ThrowIfError(s);
  }
  void AbandonStep() {
    py::gil_scoped_release release;
    script_->AbandonStep();
  }

  // A preemption notice (the script's SIGTERM), as strata-worker takes
  // one: on a thread of its own, while the script trains on (a bsp cut
  // needs this worker's steps), asks the master for a checkpoint and a
  // clean stop of the job when checkpoints are on, then stops the worker.
  // The script's tasks() then ends, step() does nothing, and finish()
  // returns without raising. Once.
  void Preempt() {
    if (preempt_.joinable()) return;
    preempt_ = std::thread([this] {
      if (env_->config.checkpoint.enabled) {
        CheckpointBeforeStopping(env_->config, [this](absl::Duration grace) {
          return worker_->RequestCheckpointAndStop(grace);
        });
      } else {
        LOG(INFO) << "SIGTERM: stopping (checkpoints are off)";
      }
      preempted_ = true;
      worker_->Shutdown();
    });
  }
  bool preempted() const { return preempted_; }
  bool Evaluating() { return script_->evaluating(); }
  // The worker's step counters: steps, samples, and the seconds of its
  // steps (busy) and of their exchanges with the pservers (comm).
  std::map<std::string, double> Stats() const {
    const worker::Worker::Stats st = worker_->stats();
    return {{"steps", static_cast<double>(st.steps)},
            {"samples", static_cast<double>(st.samples)},
            {"busy_seconds", st.busy_seconds},
            {"comm_seconds", st.comm_seconds}};
  }
  void LeaveTask() {
    py::gil_scoped_release release;
    script_->LeaveTask();
  }
  void TaskDone() {
    absl::Status s;
    {
      py::gil_scoped_release release;  // (it may wait for pulls left landing)
      s = script_->TaskDone();
    }
    ThrowIfError(s);
  }
  void Finish(const std::map<std::string, double>& metrics) { script_->Finish(metrics); }

  // Waits for the worker to end (the job done, or failed: raised).
  void Join() {
    while (!run_done_.HasBeenNotified()) {
      {
        py::gil_scoped_release release;
        run_done_.WaitForNotificationWithTimeout(absl::Milliseconds(200));
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // (SIGTERM)
    }
    {
      py::gil_scoped_release release;
      if (run_.joinable()) run_.join();
    }
    if (!preempted_) ThrowIfError(status_);
  }
  void Stop() {
    py::gil_scoped_release release;
    script_->AbandonStep();  // (a step begun by backward() and never finished)
    if (preempt_.joinable()) preempt_.join();
    if (worker_ != nullptr) worker_->Shutdown();
    if (run_.joinable()) run_.join();
  }

 private:
  std::unique_ptr<DaemonEnv> env_;
  std::unique_ptr<worker::Worker> worker_;
  worker::ScriptTrainer* script_ = nullptr;
  std::thread run_;
  absl::Status status_;  // Run's, once run_done_
  absl::Notification run_done_;
  std::thread preempt_;
  std::atomic<bool> preempted_{false};
  // Declared last, so destroyed first: the script's stage object (its
  // PyStage, which the worker may still hold, borrows it; Stop() ended
  // every call to it first).
  std::shared_ptr<PyStage> py_stage_;
  py::object stage_obj_;
};

}  // namespace
}  // namespace strata::python

PYBIND11_MODULE(_core, m) {
  using strata::python::PyWorker;
  m.doc() = "Strata's worker core for a training script (docs/python.md)";
  // worker/pipeline.h's CutStages: where each of `stages` stages begins
  // in layers of the given costs (parameters), and where the last ends.
  m.def(
      "cut_stages",
      [](const std::vector<uint64_t>& costs, int stages) {
        absl::StatusOr<std::vector<int>> bounds = strata::worker::CutStages(costs, stages);
        strata::python::ThrowIfError(bounds.status());
        return *bounds;
      },
      py::arg("costs"), py::arg("stages"));
  py::class_<PyWorker>(m, "Worker")
      .def(py::init<const std::string&, const std::string&, int, const std::string&,
                    const std::string&, int>(),
           py::arg("config"), py::arg("master"), py::arg("index"), py::arg("tls_dir") = "",
           py::arg("host") = "127.0.0.1", py::arg("http_port") = -1)
      .def("tables", &PyWorker::Tables)
      .def_property_readonly("declares_tables", &PyWorker::DeclaresTables)
      .def("declare", &PyWorker::Declare, py::arg("tables"))
      .def("share_initial_values", &PyWorker::ShareInitialValues)
      .def_property_readonly("node_id", &PyWorker::node_id)
      .def("param", [](py::object self, int i) { return PyWorker::View(self, i, false); })
      .def("grad", [](py::object self, int i) { return PyWorker::View(self, i, true); })
      .def("lookup", &PyWorker::Lookup, py::arg("table"), py::arg("keys"))
      .def("add_row_grads", &PyWorker::AddRowGrads, py::arg("table"), py::arg("keys"),
           py::arg("grads"))
      .def("next_task", &PyWorker::NextTask)
      .def("batch_size", &PyWorker::BatchSize)
      .def("step", &PyWorker::Step, py::arg("n"), py::arg("loss"), py::arg("correct") = 0,
           py::arg("ahead") = false)
      .def("wait_tables", &PyWorker::WaitTables, py::arg("tables"))
      .def("settle_ahead", &PyWorker::SettleAhead)
      .def("begin_step", &PyWorker::BeginStep, py::arg("n"))
      .def("push_table", &PyWorker::PushTable, py::arg("table"))
      .def("abandon_step", &PyWorker::AbandonStep)
      .def("task_done", &PyWorker::TaskDone)
      .def("set_stage", &PyWorker::SetStage, py::arg("stage"), py::arg("index"), py::arg("first"),
           py::arg("end"), py::arg("in_dim"), py::arg("out_dim"), py::arg("layers"))
      .def("detach_stage", &PyWorker::DetachStage)
      .def_property_readonly("stages", &PyWorker::Stages)
      .def_property_readonly("micro_batches", &PyWorker::MicroBatches)
      .def("pipeline_step", &PyWorker::PipelineStep, py::arg("x"), py::arg("y"))
      .def("leave_task", &PyWorker::LeaveTask)
      .def("preempt", &PyWorker::Preempt)
      .def_property_readonly("preempted", &PyWorker::preempted)
      .def_property_readonly("evaluating", &PyWorker::Evaluating)
      .def("stats", &PyWorker::Stats)
      .def("finish", &PyWorker::Finish)
      .def("join", &PyWorker::Join)
      .def("stop", &PyWorker::Stop);
}
