// The cost of the stream primitives the pools lean on: recording and querying an event on
// a host stream, and a round trip through a host stream's queue.
#include <benchmark/benchmark.h>

#include <utility>

#include <vram/core/event.hpp>
#include <vram/core/host_stream.hpp>

static void event_record_query_host(benchmark::State& state) {
  vram::host_stream stream;
  vram::event e;
  for (auto _ : state) {
    e.record(stream);
    benchmark::DoNotOptimize(e.query());
  }
}
BENCHMARK(event_record_query_host);

static void host_stream_enqueue_synchronize(benchmark::State& state) {
  vram::host_stream stream;
  int x = 0;
  for (auto _ : state) {
    stream.enqueue([&x] { ++x; });
    stream.synchronize();
  }
  benchmark::DoNotOptimize(std::as_const(x));
}
BENCHMARK(host_stream_enqueue_synchronize);

BENCHMARK_MAIN();
