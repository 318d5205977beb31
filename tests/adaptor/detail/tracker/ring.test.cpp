// detail::tracker::tracker_ring (the tracker's bounded event history, one entry per call)
// against a flat model: random calls of every shape the tracker records (an allocation with
// and without its segment, a free completed at once or later, a completion, an oom), at
// capacities that cut entries apart; the kept events, their order, their streams, size() and
// dropped() are checked against the newest `capacity` events of the model after each call.

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <vram/adaptor/detail/tracker/records.hpp>

namespace {

using vram::tracker_action;
using vram::tracker_event;
using vram::detail::tracker::ring_entry;
using vram::detail::tracker::tracker_ring;

struct expected {
  tracker_action action;
  std::uint64_t address;
  std::uint64_t stream;
};

/// One call: its first action, whether free_completed follows, whether a segment event goes with it.
struct call {
  tracker_action action;
  bool completed;
  bool segment;
};

/// The events a call records, written out from the tracker's rules rather than from ring_entry.
std::vector<expected> events_of(const call& c, std::uint64_t address, std::uint64_t stream, std::uint64_t segment_stream) {
  using a = tracker_action;
  switch (c.action) {
    case a::alloc:
      if (c.segment) return {{a::segment_alloc, address, stream}, {a::alloc, address, stream}};
      return {{a::alloc, address, stream}};
    case a::free_requested: {
      std::vector<expected> v{{a::free_requested, address, stream}};
      if (c.completed) v.push_back({a::free_completed, address, stream});
      if (c.segment) v.push_back({a::segment_free, address, segment_stream});
      return v;
    }
    case a::free_completed:
      if (c.segment) return {{a::free_completed, address, stream}, {a::segment_free, address, segment_stream}};
      return {{a::free_completed, address, stream}};
    default:
      return {{c.action, address, stream}};
  }
}

call random_call(std::mt19937_64& rng) {
  using a = tracker_action;
  switch (rng() % 7) {
    case 0: return {a::alloc, false, false};
    case 1: return {a::alloc, false, true};
    case 2: return {a::free_requested, false, false};  // pending on its stream
    case 3: return {a::free_requested, true, false};   // completed at once, observer mode
    case 4: return {a::free_requested, true, true};    // completed at once, its own segment
    case 5: return {a::free_completed, false, rng() % 2 == 0};
    default: return {a::oom, false, false};
  }
}

}  // namespace

TEST_CASE("tracker_ring: the newest events of random calls, in order, at any capacity", "[adaptor][tracker]") {
  const std::size_t capacity = GENERATE(0u, 1u, 2u, 3u, 4u, 7u, 64u);
  std::mt19937_64 rng(capacity + 1);
  tracker_ring ring(capacity);
  std::vector<expected> model;
  for (std::uint64_t i = 1; i <= 600; ++i) {
    const call c = random_call(rng);
    const std::uint64_t stream = rng() % 4, segment_stream = 10 + rng() % 4;
    for (const expected& e : events_of(c, i, stream, segment_stream)) model.push_back(e);
    if (ring_entry* r = ring.push(c.completed, c.segment)) {
      r->action = c.action;
      r->address = i;
      r->stream = stream;
      r->other = segment_stream;
      REQUIRE(r->count() == events_of(c, i, stream, segment_stream).size());
    } else {
      REQUIRE(capacity == 0);
    }

    const std::size_t kept = std::min(model.size(), capacity);
    REQUIRE(ring.size() == kept);
    REQUIRE(ring.dropped() == model.size() - kept);
    std::vector<tracker_event> got;
    ring.for_each([&](const tracker_event& e) { got.push_back(e); });
    REQUIRE(got.size() == kept);
    for (std::size_t k = 0; k < kept; ++k) {
      const expected& want = model[model.size() - kept + k];
      INFO("call " << i << ", kept event " << k);
      REQUIRE(got[k].action == want.action);
      REQUIRE(got[k].address == want.address);
      REQUIRE(got[k].stream == want.stream);
    }
  }
}
