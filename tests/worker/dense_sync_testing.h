// Tests of the dense allreduce (dense_sync_test, dense_ring_test): a
// member's DenseSync over a transport of its own, whose listener hands it
// the ring's messages, as the worker daemon's does.
#ifndef STRATA_TESTS_WORKER_DENSE_SYNC_TESTING_H_
#define STRATA_TESTS_WORKER_DENSE_SYNC_TESTING_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "transport/transport.h"
#include "worker/dense_sync.h"

namespace strata::worker {

struct ListeningSync {
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<DenseSync> sync;
  std::string address;  // its listener's
};

inline absl::StatusOr<ListeningSync> StartListeningSync(const transport::TransportOptions& to,
                                                        const DenseSync::Options& options,
                                                        std::vector<size_t> table_sizes) {
  ListeningSync m;
  STRATA_ASSIGN_OR_RETURN(m.transport, transport::CreateTransport(to));
  STRATA_ASSIGN_OR_RETURN(m.sync,
                          DenseSync::Create(m.transport.get(), options, std::move(table_sizes)));
  DenseSync* sync = m.sync.get();
  STRATA_RETURN_IF_ERROR(m.transport->Listen(
      "127.0.0.1", 0, [sync](transport::Message r, std::shared_ptr<transport::Responder> resp) {
        sync->Handle(std::move(r), std::move(resp));
      }));
  m.address = m.transport->listen_address();
  return m;
}

}  // namespace strata::worker

#endif  // STRATA_TESTS_WORKER_DENSE_SYNC_TESTING_H_
