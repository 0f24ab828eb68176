// The inproc backend of transport.h: transports of one process talk through
// a shared InProcNetwork, with no sockets and no serialization. It mimics the
// TCP backend's threading: each InProcTransport has one worker thread that
// runs its request handler (server side) and its response callbacks (client
// side), so Call never runs the handler re-entrantly. Messages are moved, not
// copied; max_payload_bytes is not enforced.
#ifndef STRATA_TRANSPORT_INPROC_INPROC_TRANSPORT_H_
#define STRATA_TRANSPORT_INPROC_INPROC_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/transport.h"

namespace strata::transport {
namespace inproc {

class Listener;

// One thread running posted tasks in order. Thread-safe.
class WorkerThread {
 public:
  explicit WorkerThread(std::string name);
  // Stops (REQUIRES: not on the worker thread itself, unless stopped).
  ~WorkerThread();
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  // Queues `task`; false (and `task` dropped) once stopped.
  bool Post(std::function<void()> task);
  // Lets the running task finish, discards queued ones, joins. Idempotent.
  // REQUIRES: not called from a task of this worker.
  void Stop();
  bool IsCurrentThread() const;

 private:
  void Run();

  const std::string name_;
  absl::Mutex stop_mu_;  // serializes Stop (the join)
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // joined by Stop, under stop_mu_
  const std::thread::id thread_id_;
};

// Client side of one inproc connection. Requests go to the listener's
// worker; responses complete callbacks on the client transport's worker.
// Thread-safe. Owned by the user (shared_ptr<Connection>); releasing it
// fails its pending calls with Unavailable.
class InProcConnection : public Connection, public std::enable_shared_from_this<InProcConnection> {
 public:
  InProcConnection(std::string address, std::string client_name, std::shared_ptr<Listener> listener,
                   std::shared_ptr<WorkerThread> client_worker);
  ~InProcConnection() override;
  InProcConnection(const InProcConnection&) = delete;
  InProcConnection& operator=(const InProcConnection&) = delete;

  void Call(Message request, ResponseCallback done) override;
  std::string peer() const override { return address_; }
  bool healthy() const override;
  std::string kind() const override { return "inproc"; }

  // Name of the calling side, the server's Responder::peer().
  const std::string& client_name() const { return client_name_; }

  // From a responder, any thread: completes call `request_id` on the client
  // worker. Dropped when the call is no longer pending.
  void Complete(Message response);
  // Marks the connection broken and fails every pending call with `reason`.
  void Break(const absl::Status& reason);

 private:
  // Runs the callbacks on the client worker, or here if it stopped.
  void FailAll(std::unordered_map<uint64_t, ResponseCallback> calls, const absl::Status& reason);

  const std::string address_;
  const std::string client_name_;
  const std::shared_ptr<Listener> listener_;
  const std::shared_ptr<WorkerThread> client_worker_;

  mutable absl::Mutex mu_;
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, ResponseCallback> pending_ ABSL_GUARDED_BY(mu_);
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_reason_ ABSL_GUARDED_BY(mu_);
};

// The listening side of one InProcTransport: queues requests for the
// handler on the server worker. Thread-safe. Shared by the transport, the
// network's address table and the connections to it.
class Listener : public std::enable_shared_from_this<Listener> {
 public:
  Listener(std::string address, RequestHandler handler, std::shared_ptr<WorkerThread> worker);
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  const std::string& address() const { return address_; }

  // Records a new inbound connection; false once closed.
  bool AddInbound(const std::shared_ptr<InProcConnection>& connection);
  // Queues `request` for the handler; false once closed.
  bool Deliver(std::weak_ptr<InProcConnection> from, Message request);
  // Refuses new work and breaks every inbound connection with Unavailable.
  void Close();

 private:
  const std::string address_;
  const RequestHandler handler_;
  const std::shared_ptr<WorkerThread> worker_;

  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::weak_ptr<InProcConnection>> inbound_ ABSL_GUARDED_BY(mu_);
};

// See the file comment. Thread-safe; Shutdown (and so the destructor) must
// not run on this transport's worker (inside its handler or callbacks).
class InProcTransport : public Transport {
 public:
  // REQUIRES: network != nullptr.
  explicit InProcTransport(std::shared_ptr<InProcNetwork> network);
  ~InProcTransport() override;
  InProcTransport(const InProcTransport&) = delete;
  InProcTransport& operator=(const InProcTransport&) = delete;

  absl::Status Listen(const std::string& host, int port, RequestHandler handler) override;
  std::string listen_address() const override;
  absl::StatusOr<std::shared_ptr<Connection>> Connect(const std::string& address) override;
  // Unregisters the listening address, fails pending calls (own and
  // inbound) with Unavailable, stops the worker. Idempotent.
  void Shutdown() override;

 private:
  const std::shared_ptr<InProcNetwork> network_;
  const std::string name_;  // "inproc:client-N", the peer name servers see
  const std::shared_ptr<inproc::WorkerThread> worker_;

  absl::Mutex shutdown_mu_;  // serializes Shutdown
  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Listener> listener_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<InProcConnection>> outbound_ ABSL_GUARDED_BY(mu_);
};

// Factory for CreateTransport. InvalidArgument when `network` is null.
absl::StatusOr<std::unique_ptr<Transport>> NewInProcTransport(
    std::shared_ptr<InProcNetwork> network);

}  // namespace inproc

// Declared in transport.h. The address table of the inproc backend: maps
// "host:port" to listening transports. Thread-safe.
class InProcNetwork {
 public:
  InProcNetwork() = default;
  InProcNetwork(const InProcNetwork&) = delete;
  InProcNetwork& operator=(const InProcNetwork&) = delete;

  // Registers a listener at host:port (port 0: a fresh fake port) serving
  // `handler` on `worker`. AlreadyExists naming the address when taken.
  absl::StatusOr<std::shared_ptr<inproc::Listener>> Bind(
      const std::string& host, int port, RequestHandler handler,
      std::shared_ptr<inproc::WorkerThread> worker);
  // Removes `listener` from the table if it is still registered.
  void Unbind(const inproc::Listener* listener);
  // Unavailable naming `address` when nothing listens there.
  absl::StatusOr<std::shared_ptr<inproc::Listener>> Lookup(const std::string& address) const;
  // A fresh "inproc:client-N".
  std::string NewClientName();

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<inproc::Listener>> listeners_ ABSL_GUARDED_BY(mu_);
  int next_port_ ABSL_GUARDED_BY(mu_) = 10000;
  uint64_t next_client_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata::transport

#endif  // STRATA_TRANSPORT_INPROC_INPROC_TRANSPORT_H_
