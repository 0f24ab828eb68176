// A transport::Responder for tests that keeps every response it is given.
#ifndef STRATA_TESTS_TESTING_RECORDING_RESPONDER_H_
#define STRATA_TESTS_TESTING_RECORDING_RESPONDER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transport/transport.h"

namespace strata::testing {

// Records every response it is given. Thread-safe.
class RecordingResponder : public transport::Responder {
 public:
  void Respond(transport::Message response) override {
    // A borrowed payload is only valid during Respond, as in the transports.
    response.OwnPayload();
    absl::MutexLock l(&mu_);
    responses_.push_back(std::move(response));
  }
  std::string peer() const override { return "fake:0"; }
  std::vector<transport::Message> responses() const {
    absl::MutexLock l(&mu_);
    return responses_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<transport::Message> responses_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_RECORDING_RESPONDER_H_
