// host_stream, events and stream waits: ordered, concurrent, and honest about completion.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <vram/core/event.hpp>
#include <vram/core/host_stream.hpp>

using namespace std::chrono_literals;

TEST_CASE("a host stream runs its tasks in order on another thread", "[core][streams]") {
  vram::host_stream stream;
  std::vector<int> order;
  std::atomic<bool> other_thread{true};
  auto caller = std::this_thread::get_id();
  for (int i = 0; i < 1000; ++i)
    stream.enqueue([&, i] {
      order.push_back(i);
      if (std::this_thread::get_id() == caller) other_thread = false;
    });
  stream.synchronize();
  REQUIRE(order.size() == 1000);
  for (int i = 0; i < 1000; ++i) CHECK(order[static_cast<std::size_t>(i)] == i);
  CHECK(other_thread);
  CHECK(stream.idle());
}

TEST_CASE("synchronize rethrows the first task exception", "[core][streams]") {
  vram::host_stream stream;
  stream.enqueue([] { throw std::runtime_error("first"); });
  stream.enqueue([] { throw std::runtime_error("second"); });
  CHECK_THROWS_WITH(stream.synchronize(), "first");
  CHECK_NOTHROW(stream.synchronize());
}

TEST_CASE("an event completes only after the work before it", "[core][streams]") {
  vram::host_stream stream;
  std::atomic<bool> release{false};
  stream.enqueue([&] {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  vram::event e;
  CHECK(e.query());  // never recorded: complete
  e.record(stream);
  CHECK_FALSE(e.query());
  release = true;
  e.synchronize();
  CHECK(e.query());
}

TEST_CASE("a stream waiting on another stream's event does not run ahead", "[core][streams]") {
  // Producer writes slowly; the consumer stream waits on an event after the writes and then
  // reads. Without the wait the consumer would read zeros.
  for (int round = 0; round < 20; ++round) {
    vram::host_stream producer, consumer;
    std::vector<int> data(64, 0);
    std::atomic<bool> go{false};
    producer.enqueue([&] {
      while (!go) std::this_thread::yield();
      std::this_thread::sleep_for(1ms);
      for (auto& d : data) d = round + 1;
    });
    vram::event written;
    written.record(producer);
    vram::wait(consumer, written);
    std::atomic<int> seen{-1};
    consumer.enqueue([&] { seen = data[63]; });
    CHECK_FALSE(consumer.idle());  // it is blocked on the event, the caller is not
    go = true;
    consumer.synchronize();
    CHECK(seen == round + 1);
  }
}

TEST_CASE("events work across many streams and threads at once", "[core][streams]") {
  constexpr int streams = 4;
  std::vector<std::unique_ptr<vram::host_stream>> s;
  for (int i = 0; i < streams; ++i) s.push_back(std::make_unique<vram::host_stream>());
  std::vector<std::atomic<int>> counters(streams);
  std::vector<std::thread> threads;
  for (int t = 0; t < streams; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        vram::host_stream& mine = *s[static_cast<std::size_t>(t)];
        vram::host_stream& next = *s[static_cast<std::size_t>((t + 1) % streams)];
        mine.enqueue([&counters, t] { counters[static_cast<std::size_t>(t)].fetch_add(1); });
        vram::event e;
        e.record(mine);
        int expected = i + 1;
        vram::wait(next, e);
        next.enqueue([&counters, t, expected] {
          if (counters[static_cast<std::size_t>(t)].load() < expected) throw std::runtime_error("ran ahead");
        });
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& stream : s) CHECK_NOTHROW(stream->synchronize());
  for (auto& c : counters) CHECK(c == 200);
}

TEST_CASE("the synchronous stream is always complete", "[core][streams]") {
  vram::event e;
  e.record(vram::stream_ref{});
  CHECK(e.query());
  vram::synchronize(vram::stream_ref{});
  int ran = 0;
  vram::after_pending_work(vram::stream_ref{}, [&] { ran = 1; });
  CHECK(ran == 1);
}

TEST_CASE("stream_ref identifies streams", "[core][streams]") {
  vram::host_stream a, b;
  CHECK(vram::stream_ref(a) == vram::stream_ref(a));
  CHECK_FALSE(vram::stream_ref(a) == vram::stream_ref(b));
  CHECK(vram::stream_ref{}.key() == 0);
  CHECK(vram::stream_ref::cuda_default().key() == 1);
  CHECK(vram::stream_ref(a).key() != vram::stream_ref(b).key());
  CHECK(vram::stream_ref(a).is_host());
}

TEST_CASE("an event outlives its stream", "[core][streams]") {
  vram::event e;
  {
    vram::host_stream s;
    s.enqueue([] {});
    e.record(s);
  }  // the stream drains on destruction
  CHECK(e.query());
}
