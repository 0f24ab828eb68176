// A ring allreduce among a fixed group of peers over the data plane
// (transport/transport.h: tcp, rdma or inproc), Strata's own collective
// for dense tables reduced among the workers (docs/architecture.md,
// "Collectives").
//
// Ranks 0..n-1 form a ring: rank r sends to r + 1 and receives from r - 1
// (mod n). A buffer of N floats is cut into n segments; a reduce-scatter
// of n - 1 steps leaves rank r with the sum of segment r + 1 over every
// rank, and an all-gather of n - 1 steps passes the sums round, so that
// every rank ends with the whole sum. Each rank sends 2 (n - 1) / n of the
// buffer and receives as much, whatever n. Segments go in chunks of
// `chunk_bytes`: a chunk is passed on as soon as it has arrived and been
// added, so the steps overlap (pipelined), and the messages stay small.
// A large segment is cut into at most `max_chunks` chunks, larger ones:
// past a few chunks in flight, each message's cost (an answer, a thread
// hop) buys no more overlap.
//
// Every message is a kCollective request to the next rank, answered at
// once by its receiver. A call posts where each chunk it expects goes (and
// whether it is added there or copied): the receiving thread adds or
// copies a chunk straight from the transport's buffer (with
// TransportOptions::lend_request_payloads, no copy before that), and keeps
// a copy of one that comes before its call: header.version is the operation's id (each Allreduce
// call of the group has the same one, ascending), header.flags its phase (0 reduce-scatter, 1
// all-gather), header.partition the step, header.seq the chunk, header.count the chunk's floats.
#ifndef STRATA_TRANSPORT_RING_ALLREDUCE_H_
#define STRATA_TRANSPORT_RING_ALLREDUCE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/transport.h"

namespace strata::transport {

class RingAllreduce {
 public:
  struct Options {
    uint32_t rank = 0;
    uint32_t size = 1;     // ranks in the ring
    uint32_t node_id = 0;  // this member's sender id in the headers
    // The pipelining grain: the least bytes of one message (a multiple of
    // 4, >= 4), and the most chunks of a segment (0: no bound).
    size_t chunk_bytes = 256 << 10;
    uint32_t max_chunks = 8;
    // Each wait for the previous rank's next chunk, and for the next
    // rank's acknowledgements at the end.
    absl::Duration timeout = absl::Seconds(60);
  };
  // InvalidArgument for a rank outside the ring or a bad chunk size.
  // `transport` is borrowed and must outlive this; its listener hands
  // kCollective requests to Handle().
  static absl::StatusOr<std::unique_ptr<RingAllreduce>> Create(Transport* transport,
                                                               Options options);
  // The transport's listener must no longer hand it requests (shut the
  // transport down first); answers to its sends may still come.
  ~RingAllreduce() = default;
  RingAllreduce(const RingAllreduce&) = delete;
  RingAllreduce& operator=(const RingAllreduce&) = delete;

  // Connects to the next rank, listening at `next_address`. Once per ring.
  absl::Status ConnectNext(const std::string& next_address);

  // Any thread (the transport's): a kCollective request from the previous
  // rank, kept until Allreduce takes it, and answered at once.
  void Handle(Message request, std::shared_ptr<Responder> responder);

  // Sums data[0, n) over the ring, in place, on every rank: each rank
  // calls it with the same `op` (ascending from call to call) and the
  // same n. One call at a time. Errors name the rank and peer: Unavailable
  // when a connection broke, DeadlineExceeded when the previous rank's
  // chunk did not come within the timeout (that rank, or one before it, is
  // gone or behind), InvalidArgument when a chunk is not of the size this
  // rank's n says (the ranks disagree on the buffer). A ring that failed
  // stays failed (every later call returns that error): the caller forms
  // a new one among the members left.
  absl::Status Allreduce(float* data, size_t n, uint64_t op);

  // What a caller may do to the sums on their way round (a sharded
  // optimizer: the all-gather then carries parameters). Rank r owns
  // segment r + 1 (mod n): its chunks are summed there last.
  struct Hooks {
    // At the owner, once a chunk of its segment, data[offset, offset +
    // len), holds the whole sum and has been sent on as it is: the chunk
    // may be changed in place (what this rank ends with there).
    std::function<void(size_t offset, float* chunk, size_t len)> owned;
    // At the owner's next rank, when that chunk arrives (the sum as the
    // owner sent it), before it is passed on: changed in place, it is what
    // this rank ends with there and what the ranks after it receive.
    std::function<void(size_t offset, float* chunk, size_t len)> first_gathered;
  };
  // Allreduce with `hooks` (either may be empty). On a ring of one rank,
  // `owned` gets the whole buffer.
  absl::Status Allreduce(float* data, size_t n, uint64_t op, const Hooks& hooks);
  // How a call cuts its buffer, and how it ends.
  struct Cut {
    // Segment s is data[bounds[s], bounds[s + 1]): size() + 1 ascending
    // bounds from 0 to n (a segment may be empty). A caller that owns a
    // fixed part of a large buffer reduces a piece of it this way, each
    // rank's share of the piece being where its part falls (a sharded
    // optimizer reducing bucket by bucket as a backward pass makes them).
    std::vector<size_t> bounds;
    // Waits for the next rank's acknowledgements of every send before
    // returning (a send's error is then this call's). False: the call
    // returns once its sums are in place, and a later call's wait covers
    // its sends (the buckets of one step but its last: no round trip
    // between them).
    bool settle = true;
  };
  // Allreduce cut as `cut` says. InvalidArgument for bounds that are not
  // a cut of the buffer.
  absl::Status Allreduce(float* data, size_t n, uint64_t op, const Hooks& hooks, const Cut& cut);

  // Any thread: fails the call in progress, and every later one, with
  // `why` (a member has gone on to another ring: this one cannot finish).
  void Abort(absl::Status why);

  uint32_t rank() const { return options_.rank; }
  uint32_t size() const { return options_.size; }
  // Bytes of payload this rank has sent (for benchmarks and tests).
  uint64_t bytes_sent() const;

 private:
  using Key = std::tuple<uint64_t, uint32_t, uint32_t, uint64_t>;  // op, phase, step, chunk
  RingAllreduce(Transport* transport, Options options);
  // Sends data[begin, begin + count) as (op, phase, step, chunk) to the
  // next rank; its answer is counted in State::pending.
  void Send(uint64_t op, uint32_t phase, uint32_t step, uint64_t chunk, const float* data,
            size_t count);
  // Where a chunk of the call in progress goes.
  struct Slot {
    float* dest = nullptr;
    size_t len = 0;        // floats expected
    bool add = false;      // reduce-scatter: added; all-gather: copied
    bool claimed = false;  // a handler is writing it (or has)
    bool done = false;
    absl::Status error;  // a chunk of another size
  };
  // Adds or copies `payload` (its floats) into `slot`; the error when its
  // size is not the slot's.
  absl::Status Apply(const Key& key, const Slot& slot, const char* payload, size_t bytes) const;
  // InvalidArgument unless `cut`'s bounds cut n floats into size()
  // ascending segments.
  absl::Status CheckCut(size_t n, const Cut& cut) const;
  // A call's end: with `settle`, waits for the next rank's
  // acknowledgements; its chunks still to come dropped; the ring broken
  // when the call failed. Returns the call's status.
  absl::Status EndCall(uint64_t op, bool settle, absl::Status status);
  // Waits until (op, phase, step, chunk) from the previous rank is in
  // place.
  absl::Status Await(const Key& key);
  // The first error of a send, or of an answer (OK if none).
  absl::Status SendError() const;

  Transport* const transport_;
  const Options options_;
  std::shared_ptr<Connection> next_;
  // What the transport's threads touch, shared with the callbacks of the
  // sends in flight (which may run after this is gone).
  struct State {
    absl::Mutex mu;
    absl::CondVar changed;
    std::map<Key, Slot> posted ABSL_GUARDED_BY(mu);        // the call in progress
    std::map<Key, std::string> inbox ABSL_GUARDED_BY(mu);  // chunks before their call
    int applying ABSL_GUARDED_BY(mu) = 0;                  // handlers writing into a slot now
    uint64_t pending ABSL_GUARDED_BY(mu) = 0;              // sends not answered yet
    absl::Status send_error ABSL_GUARDED_BY(mu);
    uint64_t bytes_sent ABSL_GUARDED_BY(mu) = 0;
    uint64_t done_op ABSL_GUARDED_BY(mu) = 0;  // ops below it are over: late chunks dropped
    absl::Status broken ABSL_GUARDED_BY(mu);   // the first failed Allreduce's error
  };
  const std::shared_ptr<State> st_ = std::make_shared<State>();
};

}  // namespace strata::transport

#endif  // STRATA_TRANSPORT_RING_ALLREDUCE_H_
