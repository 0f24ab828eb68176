// What the backends share (transport/transport.h is the interface; this is
// for the backends only): the Responder base, and the errors a call starts
// with.
#ifndef STRATA_TRANSPORT_ONCE_RESPONDER_H_
#define STRATA_TRANSPORT_ONCE_RESPONDER_H_

#include <atomic>
#include <functional>
#include <string>

#include "transport/transport.h"

namespace strata::transport {

// The part of a Responder every backend shares: Respond answers once (a
// second call is logged and ignored); the response gets the request's
// request_id and, when left kInvalid, the type answering the request; a
// type that is no message type becomes an Internal error response; a
// responder dropped without responding answers Internal. Backends
// implement Deliver, and call AnswerIfDropped from their destructor (the
// base's destructor cannot reach Deliver). Thread-safe.
class OnceResponder : public Responder {
 public:
  // `backend`: "tcp", "rdma", ... for logs.
  OnceResponder(const MessageHeader& request, std::string peer, const char* backend)
      : request_(request), peer_(std::move(peer)), backend_(backend) {}
  // A backend that forgot AnswerIfDropped in its destructor shows here.
  ~OnceResponder() override;

  void Respond(Message response) final;
  std::string peer() const final { return peer_; }

 protected:
  // Sends the finished response, or drops it when the connection is gone.
  virtual void Deliver(Message response) = 0;
  void AnswerIfDropped();
  const MessageHeader& request() const { return request_; }

 private:
  const MessageHeader request_;
  const std::string peer_;
  const char* const backend_;
  std::atomic<bool> responded_{false};
};

// A call of `type` to `peer`: InvalidArgument when it is no message type
// (a backend puts only those on the wire), else OK.
absl::Status CheckCallType(MessageType type, const std::string& peer);
// What a call on a connection to `peer` that broke with `why` gets.
absl::Status BrokenConnectionError(const std::string& peer, const absl::Status& why);
// The start of a client call of `type` on a connection to `peer`: checks
// the type (CheckCallType), then has `add` register the call as pending —
// `add` takes *done and returns OK, or returns why the connection broke
// and leaves *done alone. True once registered; else *done is answered
// (InvalidArgument, or BrokenConnectionError) and false returned.
bool StartCall(MessageType type, const std::string& peer, ResponseCallback* done,
               const std::function<absl::Status()>& add);

}  // namespace strata::transport

#endif  // STRATA_TRANSPORT_ONCE_RESPONDER_H_
