// A process that takes part in a quota ledger, for the multi-process tests
// (quota_ledger_processes.test.cpp). Every mode reads its stdin to the end as "finish".
//
//   ledger_worker race <ledger> <tenant path> host|simulated <seed> <operations>
//       Attaches with charge access and allocates and frees random sizes through a
//       ledger_quota_adaptor: over host_source (charging each request), or under a
//       stream_pool over simulated_device_source (charging the pool's chunks). Prints
//       "ready"; after <operations> (0: until killed) prints
//       "charged <bytes this process has charged> granted <n> refused <n>"; at end of input
//       frees everything, checks the adaptor's invariants and prints "done".
//   ledger_worker sample <ledger>
//       Attaches read-only and reads every tenant's usage and hard limit as fast as it can.
//       Prints "ready"; at end of input prints "samples <n> violations <n>", where a
//       violation is a tenant seen above its hard limit.
//   ledger_worker hold <ledger> <tenant path> <bytes>
//       Attaches with charge access and charges <bytes> to the tenant. Prints "ready <pid>";
//       at end of input gives its slot back (with the charge) and exits.

#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <vram/adaptor/ledger_quota_adaptor.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/ref.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

namespace {

bool input_ended() {
  pollfd p{0, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char c;
  return ::read(0, &c, 1) <= 0;
}

void wait_for_end_of_input() {
  char c;
  while (::read(0, &c, 1) > 0) {
  }
}

void say(const std::string& line) {
  std::string l = line + "\n";
  if (::write(1, l.data(), l.size()) != static_cast<ssize_t>(l.size())) std::exit(3);
}

template <class Resource>
void race(Resource& r, vram::quota_ledger& ledger, vram::tenant t, unsigned seed, long operations,
          std::size_t min_bytes, std::size_t max_bytes) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> size(min_bytes, max_bytes);
  std::vector<std::pair<void*, std::size_t>> live;
  long granted = 0, refused = 0;
  for (long i = 0; operations == 0 || i < operations; ++i) {
    if (!live.empty() && (live.size() >= 64 || rng() % 2 == 0)) {
      std::size_t k = rng() % live.size();
      r.deallocate_sync(live[k].first, live[k].second);
      live[k] = live.back();
      live.pop_back();
      continue;
    }
    std::size_t bytes = size(rng);
    try {
      live.emplace_back(r.allocate_sync(bytes), bytes);
      ++granted;
    } catch (const std::bad_alloc&) {  // quota_exceeded, or the pool's out_of_memory over it
      ++refused;
    }
  }
  say("charged " + std::to_string(ledger.charged(t)) + " granted " + std::to_string(granted) + " refused " +
      std::to_string(refused));
  wait_for_end_of_input();
  for (auto [p, bytes] : live) r.deallocate_sync(p, bytes);
}

int run_race(char** argv) {
  auto ledger = vram::quota_ledger::attach(argv[2]);
  vram::tenant t = ledger->at(argv[3]);
  const std::string backend = argv[4];
  const unsigned seed = static_cast<unsigned>(std::strtoul(argv[5], nullptr, 10));
  const long operations = std::strtol(argv[6], nullptr, 10);
  if (backend == "host") {
    vram::ledger_quota_adaptor<vram::host_source> charged(vram::host_source{}, {ledger, t});
    say("ready");
    race(charged, *ledger, t, seed, operations, 1 << 10, 256 << 10);
    charged.check_invariants();
  } else {
    vram::ledger_quota_adaptor<vram::simulated_device_source> charged(
        vram::simulated_device_source(vram::simulated_device_options{.capacity = std::size_t{1} << 30}), {ledger, t});
    {
      vram::stream_pool pool(vram::ref(charged), vram::stream_pool_options{.growth_step = 1 << 20});
      say("ready");
      race(pool, *ledger, t, seed, operations, 4 << 10, 512 << 10);
      pool.release();
      pool.check_invariants();
    }
    charged.check_invariants();
    if (ledger->charged(t) != 0) {
      std::fprintf(stderr, "ledger_worker: the pool is gone and %zu bytes are still charged\n", ledger->charged(t));
      return 1;
    }
  }
  say("done");
  return 0;
}

int run_sample(char** argv) {
  auto ledger = vram::quota_ledger::attach(argv[2], vram::ledger_access::read);
  say("ready");
  std::size_t samples = 0, violations = 0;
  do {
    for (int k = 0; k < 1024; ++k) {
      const std::size_t n = ledger->tenant_count();
      for (std::uint32_t i = 0; i < n; ++i) {
        vram::tenant t{i};
        std::size_t hard = ledger->hard_limit(t);
        if (ledger->usage(t) > hard) ++violations;
      }
      ++samples;
    }
  } while (!input_ended());
  say("samples " + std::to_string(samples) + " violations " + std::to_string(violations));
  return 0;
}

int run_hold(char** argv) {
  auto ledger = vram::quota_ledger::attach(argv[2]);
  if (!ledger->charge(ledger->at(argv[3]), std::strtoull(argv[4], nullptr, 10)).granted) {
    std::fprintf(stderr, "ledger_worker: the charge was refused\n");
    return 1;
  }
  say("ready " + std::to_string(::getpid()));
  wait_for_end_of_input();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 7 && std::strcmp(argv[1], "race") == 0) return run_race(argv);
    if (argc == 3 && std::strcmp(argv[1], "sample") == 0) return run_sample(argv);
    if (argc == 5 && std::strcmp(argv[1], "hold") == 0) return run_hold(argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ledger_worker: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: ledger_worker race <ledger> <tenant> host|simulated <seed> <operations>\n"
                       "       ledger_worker sample <ledger>\n"
                       "       ledger_worker hold <ledger> <tenant> <bytes>\n");
  return 2;
}
