#include "transport/inproc/inproc_transport.h"

#include <glog/logging.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "transport/once_responder.h"

namespace strata::transport {
namespace inproc {
namespace {

using CallMap = std::unordered_map<uint64_t, ResponseCallback>;

// Answers one request delivered by a Listener. Holds the calling connection
// weakly: once it is gone the response is dropped. Thread-safe.
class InProcResponder final : public OnceResponder {
 public:
  InProcResponder(std::weak_ptr<InProcConnection> connection, const MessageHeader& request,
                  std::string peer)
      : OnceResponder(request, std::move(peer), "inproc"), connection_(std::move(connection)) {}
  ~InProcResponder() override { AnswerIfDropped(); }

 private:
  void Deliver(Message response) override {
    response.OwnPayload();  // delivered later, on another thread
    std::shared_ptr<InProcConnection> connection = connection_.lock();
    if (connection == nullptr) {
      VLOG(1) << "inproc: dropping response to " << peer() << ": connection released";
      return;
    }
    connection->Complete(std::move(response));
  }

  const std::weak_ptr<InProcConnection> connection_;
};

// Runs `callbacks` with `status` on `worker`, or on this thread when the
// worker has stopped.
void RunCallbacks(WorkerThread* worker, CallMap callbacks, const absl::Status& status) {
  if (callbacks.empty()) return;
  auto shared = std::make_shared<CallMap>(std::move(callbacks));
  std::function<void()> task = [shared, status] {
    for (auto& entry : *shared) entry.second(status);
  };
  if (!worker->Post(task)) task();
}

}  // namespace

// ---------------------------------------------------------------------------
// WorkerThread.

WorkerThread::WorkerThread(std::string name)
    : name_(std::move(name)), thread_([this] { Run(); }), thread_id_(thread_.get_id()) {}

WorkerThread::~WorkerThread() { Stop(); }

bool WorkerThread::Post(std::function<void()> task) {
  absl::MutexLock l(&mu_);
  if (stopped_) return false;
  tasks_.push_back(std::move(task));
  return true;
}

void WorkerThread::Stop() {
  absl::MutexLock stop_lock(&stop_mu_);
  std::deque<std::function<void()>> dropped;
  {
    absl::MutexLock l(&mu_);
    stopped_ = true;
    dropped.swap(tasks_);
  }
  if (thread_.joinable()) {
    CHECK(!IsCurrentThread()) << "inproc worker " << name_ << " stopped from one of its own tasks";
    thread_.join();
  }
  // `dropped` is destroyed here, outside mu_.
}

bool WorkerThread::IsCurrentThread() const { return std::this_thread::get_id() == thread_id_; }

void WorkerThread::Run() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerThread* w)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->stopped_ || !w->tasks_.empty(); },
          this));
      if (stopped_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

// ---------------------------------------------------------------------------
// InProcConnection.

InProcConnection::InProcConnection(std::string address, std::string client_name,
                                   std::shared_ptr<Listener> listener,
                                   std::shared_ptr<WorkerThread> client_worker)
    : address_(std::move(address)),
      client_name_(std::move(client_name)),
      listener_(std::move(listener)),
      client_worker_(std::move(client_worker)) {}

InProcConnection::~InProcConnection() {
  CallMap pending;
  {
    absl::MutexLock l(&mu_);
    pending.swap(pending_);
  }
  RunCallbacks(
      client_worker_.get(), std::move(pending),
      absl::UnavailableError(absl::StrCat("connection to ", address_, " released by its owner")));
}

void InProcConnection::Call(Message request, ResponseCallback done) {
  request.OwnPayload();  // delivered later, on another thread
  uint64_t id = 0;
  if (!StartCall(request.header.type, address_, &done, [&] {
        absl::MutexLock l(&mu_);
        if (broken_) return broken_reason_;
        id = ++next_request_id_;
        pending_.emplace(id, std::move(done));
        return absl::OkStatus();
      })) {
    return;
  }
  request.header.request_id = id;
  if (!listener_->Deliver(weak_from_this(), std::move(request))) {
    Break(absl::UnavailableError(absl::StrCat("inproc server at ", address_, " is shut down")));
  }
}

bool InProcConnection::healthy() const {
  absl::MutexLock l(&mu_);
  return !broken_;
}

void InProcConnection::Complete(Message response) {
  ResponseCallback callback;
  {
    absl::MutexLock l(&mu_);
    auto it = pending_.find(response.header.request_id);
    if (it == pending_.end()) {
      VLOG(1) << "inproc: dropping response from " << address_ << " to request "
              << response.header.request_id << " (no longer pending)";
      return;
    }
    callback = std::move(it->second);
    pending_.erase(it);
  }
  auto shared_callback = std::make_shared<ResponseCallback>(std::move(callback));
  auto shared_response = std::make_shared<Message>(std::move(response));
  std::function<void()> task = [shared_callback, shared_response] {
    (*shared_callback)(std::move(*shared_response));
  };
  if (!client_worker_->Post(task)) task();
}

void InProcConnection::Break(const absl::Status& reason) {
  CallMap pending;
  {
    absl::MutexLock l(&mu_);
    if (!broken_) {
      broken_ = true;
      broken_reason_ = reason;
    }
    pending.swap(pending_);
  }
  FailAll(std::move(pending), reason);
}

void InProcConnection::FailAll(CallMap calls, const absl::Status& reason) {
  RunCallbacks(client_worker_.get(), std::move(calls), reason);
}

// ---------------------------------------------------------------------------
// Listener.

Listener::Listener(std::string address, RequestHandler handler,
                   std::shared_ptr<WorkerThread> worker)
    : address_(std::move(address)), handler_(std::move(handler)), worker_(std::move(worker)) {}

bool Listener::AddInbound(const std::shared_ptr<InProcConnection>& connection) {
  absl::MutexLock l(&mu_);
  if (closed_) return false;
  std::vector<std::weak_ptr<InProcConnection>> live;
  for (auto& weak : inbound_) {
    if (!weak.expired()) live.push_back(std::move(weak));
  }
  live.push_back(connection);
  inbound_.swap(live);
  return true;
}

bool Listener::Deliver(std::weak_ptr<InProcConnection> from, Message request) {
  {
    absl::MutexLock l(&mu_);
    if (closed_) return false;
  }
  std::shared_ptr<Listener> self = shared_from_this();
  auto shared_request = std::make_shared<Message>(std::move(request));
  return worker_->Post([self, from, shared_request] {
    std::string peer;
    {
      std::shared_ptr<InProcConnection> connection = from.lock();
      if (connection == nullptr) return;  // the caller released it meanwhile
      peer = connection->client_name();
    }
    auto responder =
        std::make_shared<InProcResponder>(from, shared_request->header, std::move(peer));
    self->handler_(std::move(*shared_request), std::move(responder));
  });
}

void Listener::Close() {
  std::vector<std::weak_ptr<InProcConnection>> inbound;
  {
    absl::MutexLock l(&mu_);
    if (closed_) return;
    closed_ = true;
    inbound.swap(inbound_);
  }
  const absl::Status reason =
      absl::UnavailableError(absl::StrCat("inproc server at ", address_, " shut down"));
  for (auto& weak : inbound) {
    if (std::shared_ptr<InProcConnection> c = weak.lock()) c->Break(reason);
  }
}

// ---------------------------------------------------------------------------
// InProcTransport.

InProcTransport::InProcTransport(std::shared_ptr<InProcNetwork> network)
    : network_(std::move(network)),
      name_(network_->NewClientName()),
      worker_(std::make_shared<WorkerThread>(name_)) {}

InProcTransport::~InProcTransport() { Shutdown(); }

absl::Status InProcTransport::Listen(const std::string& host, int port, RequestHandler handler) {
  absl::MutexLock l(&mu_);
  if (shut_down_) {
    return absl::FailedPreconditionError(
        absl::StrCat("listen on ", host, ":", port, ": transport is shut down"));
  }
  if (listener_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "listen on ", host, ":", port, ": already listening on ", listener_->address()));
  }
  auto listener = network_->Bind(host, port, std::move(handler), worker_);
  if (!listener.ok()) return listener.status();
  listener_ = std::move(listener).value();
  return absl::OkStatus();
}

std::string InProcTransport::listen_address() const {
  absl::MutexLock l(&mu_);
  return listener_ == nullptr ? "" : listener_->address();
}

absl::StatusOr<std::shared_ptr<Connection>> InProcTransport::Connect(const std::string& address) {
  {
    absl::MutexLock l(&mu_);
    if (shut_down_) {
      return absl::UnavailableError(
          absl::StrCat("connect to ", address, ": transport is shut down"));
    }
  }
  auto listener = network_->Lookup(address);
  if (!listener.ok()) return listener.status();
  auto connection = std::make_shared<InProcConnection>(address, name_, *listener, worker_);
  if (!(*listener)->AddInbound(connection)) {
    return absl::UnavailableError(absl::StrCat("connect to ", address, ": server is shut down"));
  }
  absl::MutexLock l(&mu_);
  if (shut_down_) {
    return absl::UnavailableError(absl::StrCat("connect to ", address, ": transport is shut down"));
  }
  std::vector<std::weak_ptr<InProcConnection>> live;
  for (auto& weak : outbound_) {
    if (!weak.expired()) live.push_back(std::move(weak));
  }
  live.push_back(connection);
  outbound_.swap(live);
  return std::shared_ptr<Connection>(std::move(connection));
}

void InProcTransport::Shutdown() {
  CHECK(!worker_->IsCurrentThread())
      << "InProcTransport::Shutdown called from its own worker (a handler or "
         "response callback)";
  absl::MutexLock shutdown_lock(&shutdown_mu_);
  std::shared_ptr<Listener> listener;
  std::vector<std::weak_ptr<InProcConnection>> outbound;
  {
    absl::MutexLock l(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    listener = listener_;
    outbound.swap(outbound_);
  }
  if (listener != nullptr) {
    network_->Unbind(listener.get());
    listener->Close();  // fails calls of every client of this server
  }
  worker_->Stop();
  for (auto& weak : outbound) {
    if (std::shared_ptr<InProcConnection> c = weak.lock()) {
      c->Break(absl::UnavailableError(
          absl::StrCat("connection to ", c->peer(), " closed: transport shut down")));
    }
  }
}

absl::StatusOr<std::unique_ptr<Transport>> NewInProcTransport(
    std::shared_ptr<InProcNetwork> network) {
  if (network == nullptr) {
    return absl::InvalidArgumentError("inproc transport needs a network");
  }
  return std::unique_ptr<Transport>(new InProcTransport(std::move(network)));
}

}  // namespace inproc

// ---------------------------------------------------------------------------
// InProcNetwork.

absl::StatusOr<std::shared_ptr<inproc::Listener>> InProcNetwork::Bind(
    const std::string& host, int port, RequestHandler handler,
    std::shared_ptr<inproc::WorkerThread> worker) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("listen on ", host, ":", port, ": bad port"));
  }
  absl::MutexLock l(&mu_);
  std::string address;
  if (port == 0) {
    do {
      address = absl::StrCat(host, ":", next_port_++);
    } while (listeners_.count(address) != 0);
  } else {
    address = absl::StrCat(host, ":", port);
    if (listeners_.count(address) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("listen on ", address, ": address in use"));
    }
  }
  auto listener =
      std::make_shared<inproc::Listener>(address, std::move(handler), std::move(worker));
  listeners_[address] = listener;
  return listener;
}

void InProcNetwork::Unbind(const inproc::Listener* listener) {
  absl::MutexLock l(&mu_);
  auto it = listeners_.find(listener->address());
  if (it != listeners_.end() && it->second.get() == listener) {
    listeners_.erase(it);
  }
}

absl::StatusOr<std::shared_ptr<inproc::Listener>> InProcNetwork::Lookup(
    const std::string& address) const {
  absl::MutexLock l(&mu_);
  auto it = listeners_.find(address);
  if (it == listeners_.end()) {
    return absl::UnavailableError(absl::StrCat("no inproc listener at ", address));
  }
  return it->second;
}

std::string InProcNetwork::NewClientName() {
  absl::MutexLock l(&mu_);
  return absl::StrCat("inproc:client-", ++next_client_);
}

}  // namespace strata::transport
