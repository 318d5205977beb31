// The C ABI (libvram_c), loaded with dlopen as PyTorch and CuPy load it, on the host and
// simulated backends (no GPU needed).
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <vram/vram_c.h>
#include <vram/adaptor/quota_ledger.hpp>
#include <vram/trace/read_trace.hpp>

#include <vram/core/parse.hpp>

#include "support/hostile_values.hpp"
#include "support/scratch_ledger.hpp"

#ifndef VRAM_C_LIBRARY
#  error "VRAM_C_LIBRARY (the path of libvram_c) is set by capi/CMakeLists.txt"
#endif

namespace {

// The ABI as function pointers looked up by name, exactly what the frameworks do.
struct abi {
  void* handle = nullptr;
  decltype(&vram_malloc) malloc_ = nullptr;
  decltype(&vram_free) free_ = nullptr;
  decltype(&vram_init) init = nullptr;
  decltype(&vram_empty_cache) empty_cache = nullptr;
  decltype(&vram_mark_step) mark_step = nullptr;
  decltype(&vram_set_memory_fraction) set_memory_fraction = nullptr;
  decltype(&vram_record_stream) record_stream = nullptr;
  decltype(&vram_cupy_malloc) cupy_malloc = nullptr;
  decltype(&vram_cupy_free) cupy_free = nullptr;
  decltype(&vram_stats) stats = nullptr;
  decltype(&vram_snapshot) snapshot = nullptr;
  decltype(&vram_set_tenant) set_tenant = nullptr;
  decltype(&vram_set_tenant_quota) set_tenant_quota = nullptr;
  decltype(&vram_tenant_usage) tenant_usage = nullptr;
  decltype(&vram_last_error) last_error = nullptr;
  decltype(&vram_describe) describe = nullptr;
  decltype(&vram_shutdown) shutdown = nullptr;

  template <class F>
  void bind(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(handle, name));
    INFO(name);
    REQUIRE(f != nullptr);
  }

  abi() {
    handle = dlopen(VRAM_C_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    INFO((handle == nullptr ? dlerror() : ""));
    REQUIRE(handle != nullptr);
    bind(malloc_, "vram_malloc");
    bind(free_, "vram_free");
    bind(init, "vram_init");
    bind(empty_cache, "vram_empty_cache");
    bind(mark_step, "vram_mark_step");
    bind(set_memory_fraction, "vram_set_memory_fraction");
    bind(record_stream, "vram_record_stream");
    bind(cupy_malloc, "vram_cupy_malloc");
    bind(cupy_free, "vram_cupy_free");
    bind(stats, "vram_stats");
    bind(snapshot, "vram_snapshot");
    bind(set_tenant, "vram_set_tenant");
    bind(set_tenant_quota, "vram_set_tenant_quota");
    bind(tenant_usage, "vram_tenant_usage");
    bind(last_error, "vram_last_error");
    bind(describe, "vram_describe");
    bind(shutdown, "vram_shutdown");
  }
  ~abi() {
    shutdown();
    dlclose(handle);
  }
};

abi& lib() {
  static abi a;
  return a;
}

// Sets the environment for the next device creation and tears the old ones down.
void configure(std::initializer_list<std::pair<const char*, const char*>> vars) {
  for (const char* name : {"VRAM_BACKEND", "VRAM_ALLOCATOR", "VRAM_POOL_INITIAL", "VRAM_POOL_MAX", "VRAM_POOL_STEP",
                           "VRAM_DEVICE_BUDGET", "VRAM_TENANT", "VRAM_TENANT_QUOTA", "VRAM_DEVICE_COUNT",
                           "VRAM_LEDGER", "VRAM_LEDGER_TENANT", "VRAM_EVENT_LOG", "VRAM_PLAN"})
    unsetenv(name);
  for (auto [name, value] : vars) setenv(name, value, 1);
  lib().shutdown();
  lib().set_tenant(nullptr);
}

/// What vram_snapshot writes to a file called `name` in the temp directory (the format from
/// its extension); the file is removed.
std::string snapshot_text(const char* name) {
  std::string path = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/" + name;
  REQUIRE(lib().snapshot(path.c_str()) == 0);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path.c_str());
  return text.str();
}

vram_stats_t stats_of(int device) {
  vram_stats_t s{};
  REQUIRE(lib().stats(device, &s) == 0);
  return s;
}

}  // namespace

TEST_CASE("C ABI: PyTorch-style malloc/free on the host backend", "[interop][c_abi]") {
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_ALLOCATOR", "pool"}, {"VRAM_POOL_STEP", "4M"}});
  auto& a = lib();
  REQUIRE(a.init(0) == 0);
  CHECK(std::string(a.describe(0)) == "host/pool");

  std::vector<void*> blocks;
  for (int i = 1; i <= 64; ++i) {
    void* p = a.malloc_(std::size_t(i) * 1000, 0, nullptr);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
    std::memset(p, i, std::size_t(i) * 1000);  // host backend: real, writable memory
    blocks.push_back(p);
  }
  vram_stats_t s = stats_of(0);
  CHECK(s.live_allocations == 64);
  CHECK(s.live_bytes >= 64 * 65 / 2 * 1000);
  CHECK(s.reserved_bytes >= s.live_bytes);
  for (int i = 1; i <= 64; ++i) {
    auto* p = static_cast<unsigned char*>(blocks[std::size_t(i - 1)]);
    CHECK(p[0] == i);
    CHECK(p[std::size_t(i) * 1000 - 1] == i);
    a.free_(p, std::size_t(i) * 1000, 0, nullptr);
  }
  s = stats_of(0);
  CHECK(s.live_bytes == 0);
  CHECK(s.live_allocations == 0);
  CHECK(s.total_allocations >= 64);
  CHECK(s.reserved_bytes > 0);  // the pool keeps its cache ...
  a.empty_cache();
  CHECK(stats_of(0).reserved_bytes == 0);  // ... until empty_cache

  CHECK(a.malloc_(0, 0, nullptr) == nullptr);  // zero bytes: null, not an error
  a.free_(nullptr, 0, 0, nullptr);             // no-op
}

TEST_CASE("C ABI: CuPy-style malloc/free without sizes, several devices", "[interop][c_abi]") {
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_DEVICE_COUNT", "3"}});
  auto& a = lib();
  void* p0 = a.cupy_malloc(nullptr, 5000, 0);
  void* p2 = a.cupy_malloc(nullptr, 7000, 2);
  REQUIRE(p0 != nullptr);
  REQUIRE(p2 != nullptr);
  CHECK(stats_of(2).live_allocations == 1);
  CHECK(a.cupy_malloc(nullptr, 10, 3) == nullptr);  // beyond VRAM_DEVICE_COUNT
  CHECK(std::string(a.last_error()).find("VRAM_DEVICE_COUNT") != std::string::npos);

  // The library has its own error handler (it is a separate binary): misuse shows in stats.
  a.cupy_free(nullptr, p2, 0);  // wrong device: reported, nothing freed
  CHECK(stats_of(0).misuses == 1);
  CHECK(stats_of(2).live_allocations == 1);
  a.cupy_free(nullptr, p0, 0);
  a.cupy_free(nullptr, p2, 2);
  CHECK(stats_of(0).live_bytes == 0);
  CHECK(stats_of(2).live_bytes == 0);
}

TEST_CASE("C ABI: misuse is reported and changes nothing", "[interop][c_abi]") {
  configure({{"VRAM_BACKEND", "host"}});
  auto& a = lib();
  void* p = a.malloc_(4096, 0, nullptr);
  REQUIRE(p != nullptr);
  a.free_(p, 4000, 0, nullptr);  // wrong size
  CHECK(stats_of(0).misuses == 1);
  int local = 0;
  a.free_(&local, 4, 0, nullptr);  // foreign pointer
  CHECK(stats_of(0).misuses == 2);
  CHECK(stats_of(0).live_allocations == 1);
  a.free_(p, 4096, 0, nullptr);
  CHECK(stats_of(0).misuses == 2);
  a.free_(p, 4096, 0, nullptr);  // double free: no longer ours
  CHECK(stats_of(0).misuses == 3);
  CHECK(stats_of(0).live_allocations == 0);
}

TEST_CASE("C ABI: out of memory returns null and says why", "[interop][c_abi]") {
  configure({{"VRAM_BACKEND", "simulated"}, {"VRAM_DEVICE_BUDGET", "64M"}, {"VRAM_POOL_STEP", "2M"}});
  auto& a = lib();
  void* big = a.malloc_(std::size_t{48} << 20, 0, nullptr);
  REQUIRE(big != nullptr);
  CHECK(std::string(a.describe(0)) == "simulated/pool");
  CHECK(a.malloc_(std::size_t{32} << 20, 0, nullptr) == nullptr);
  std::string why = a.last_error();
  INFO(why);
  CHECK(why.find("out of memory") != std::string::npos);
  CHECK(why.find("cause: exhaustion") != std::string::npos);
  CHECK(why.find("\nheld by: tenant 'default' 48.00 MiB.") != std::string::npos);  // the stack's tracker
  CHECK(stats_of(0).ooms == 1);
  a.free_(big, std::size_t{48} << 20, 0, nullptr);
  void* again = a.malloc_(std::size_t{32} << 20, 0, nullptr);  // fits once the first is gone
  CHECK(again != nullptr);
  a.free_(again, std::size_t{32} << 20, 0, nullptr);
}

TEST_CASE("C ABI: memory fraction caps a device", "[interop][c_abi]") {
  configure({{"VRAM_BACKEND", "simulated"}, {"VRAM_DEVICE_BUDGET", "1G"}});
  auto& a = lib();
  CHECK(a.set_memory_fraction(1.5, 0) == -1);
  CHECK(a.set_memory_fraction(0.25, 0) == 0);  // 256 MiB
  CHECK(stats_of(0).limit_bytes == std::size_t{256} << 20);
  void* p = a.malloc_(std::size_t{200} << 20, 0, nullptr);
  REQUIRE(p != nullptr);
  CHECK(a.malloc_(std::size_t{100} << 20, 0, nullptr) == nullptr);
  CHECK(std::string(a.last_error()).find("memory fraction") != std::string::npos);
  void* q = a.malloc_(std::size_t{50} << 20, 0, nullptr);
  CHECK(q != nullptr);
  a.free_(p, std::size_t{200} << 20, 0, nullptr);
  a.free_(q, std::size_t{50} << 20, 0, nullptr);
  CHECK(a.set_memory_fraction(1.0, 0) == 0);  // no cap
  CHECK(stats_of(0).limit_bytes == 0);

  // Blocks allocated with no cap count against one set later, and their frees give it back.
  void* before = a.malloc_(std::size_t{200} << 20, 0, nullptr);
  REQUIRE(before != nullptr);
  CHECK(a.set_memory_fraction(0.25, 0) == 0);
  CHECK(a.malloc_(std::size_t{100} << 20, 0, nullptr) == nullptr);
  a.cupy_free(nullptr, before, 0);
  void* all = a.malloc_(std::size_t{256} << 20, 0, nullptr);  // the whole cap: nothing left charged
  CHECK(all != nullptr);
  a.free_(all, std::size_t{256} << 20, 0, nullptr);
  CHECK(a.set_memory_fraction(1.0, 0) == 0);
}

TEST_CASE("C ABI: under a memory fraction, threads that allocate and free concurrently never pass it", "[interop][c_abi]") {
  configure({{"VRAM_BACKEND", "simulated"}, {"VRAM_DEVICE_BUDGET", "1G"}});
  auto& a = lib();
  constexpr std::size_t cap = std::size_t{64} << 20;
  REQUIRE(a.set_memory_fraction(0.0625, 0) == 0);  // 64 MiB
  REQUIRE(stats_of(0).limit_bytes == cap);
  std::atomic<std::size_t> held{0}, peak{0};
  std::atomic<int> bad{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < 3000; ++i) {
        const std::size_t n = (std::size_t{1} << 20) + std::size_t((i * 7919 + t * 104729) % (std::size_t{3} << 20));
        if (void* p = a.malloc_(n, 0, nullptr)) {
          // `held` counts a block after its charge and stops before its free: never more than
          // the library has charged at that instant.
          const std::size_t now = held.fetch_add(n) + n;
          for (std::size_t seen = peak.load(); now > seen && !peak.compare_exchange_weak(seen, now);) {
          }
          mine.emplace_back(p, n);
        } else {
          ++refused;
          if (std::string(a.last_error()).find("memory fraction") == std::string::npos) ++bad;
        }
        if (!mine.empty() && (i % 2 == 0 || mine.size() > 8)) {
          auto [q, m] = mine.front();
          mine.erase(mine.begin());
          held.fetch_sub(m);
          if (i % 4 == 0) a.cupy_free(nullptr, q, 0);
          else a.free_(q, m, 0, nullptr);
        }
      }
      for (auto [q, m] : mine) {
        held.fetch_sub(m);
        a.free_(q, m, 0, nullptr);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
  CHECK(refused > 0);  // the cap was reached
  CHECK(peak <= cap);
  CHECK(stats_of(0).live_allocations == 0);
  void* all = a.malloc_(cap, 0, nullptr);  // every charge was given back
  CHECK(all != nullptr);
  a.free_(all, cap, 0, nullptr);
  CHECK(a.set_memory_fraction(1.0, 0) == 0);
}

TEST_CASE("C ABI: slab allocator spills beyond its device budget", "[interop][c_abi]") {
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_ALLOCATOR", "slab"}, {"VRAM_DEVICE_BUDGET", "1M"}});
  auto& a = lib();
  REQUIRE(a.init(0) == 0);
  CHECK(std::string(a.describe(0)) == "host/slab");
  void* p = a.malloc_(std::size_t{768} << 10, 0, nullptr);
  void* q = a.malloc_(std::size_t{768} << 10, 0, nullptr);  // over the budget: spilled
  REQUIRE(p != nullptr);
  REQUIRE(q != nullptr);
  CHECK(stats_of(0).spills == 1);
  a.free_(p, std::size_t{768} << 10, 0, nullptr);
  a.free_(q, std::size_t{768} << 10, 0, nullptr);
  CHECK(stats_of(0).live_allocations == 0);
}

TEST_CASE("C ABI: bad configuration fails cleanly", "[interop][c_abi]") {
  auto& a = lib();
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_ALLOCATOR", "bogus"}});
  CHECK(a.init(0) == -1);
  CHECK(std::string(a.last_error()).find("VRAM_ALLOCATOR") != std::string::npos);
  CHECK(a.malloc_(100, 0, nullptr) == nullptr);
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_POOL_MAX", "12 apples"}});
  CHECK(a.init(0) == -1);
  CHECK(std::string(a.last_error()).find("VRAM_POOL_MAX") != std::string::npos);
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_ALLOCATOR", "slab"}});  // slab without a budget
  CHECK(a.init(0) == -1);
  configure({{"VRAM_BACKEND", "host"}});
  CHECK(a.init(-1) == -1);
  CHECK(a.init(0) == 0);
  vram_stats_t s;
  CHECK(a.stats(5, &s) == -1);  // never used
  CHECK(a.stats(0, nullptr) == -1);
}

TEST_CASE("C ABI: every variable refuses every hostile value, naming itself and the text as given",
          "[interop][c_abi]") {
  using vram::test::hostile_value;
  std::vector<hostile_value> common(std::begin(vram::test::hostile_values), std::end(vram::test::hostile_values));
  std::vector<hostile_value> sizes = common, counts = common, choices = common;
  sizes.insert(sizes.end(), std::begin(vram::test::hostile_sizes), std::end(vram::test::hostile_sizes));
  counts.insert(counts.end(), std::begin(vram::test::huge_counts), std::end(vram::test::huge_counts));
  for (const char* beyond : {"0", "65", "1.9"}) counts.push_back({"out of 1..64", beyond});
  for (const char* odd : {" host", "HOST", "host\n", "1 ", "yes"}) choices.push_back({"not a choice", odd});
  const std::pair<const char*, const std::vector<hostile_value>*> variables[] = {
      {"VRAM_POOL_INITIAL", &sizes}, {"VRAM_POOL_MAX", &sizes},     {"VRAM_POOL_STEP", &sizes},
      {"VRAM_DEVICE_BUDGET", &sizes}, {"VRAM_TENANT_QUOTA", &sizes}, {"VRAM_DEVICE_COUNT", &counts},
      {"VRAM_BACKEND", &choices},     {"VRAM_ALLOCATOR", &choices}, {"VRAM_PLAN", &choices}};
  auto& a = lib();
  for (auto [name, values] : variables)
    for (const hostile_value& v : *values) {
      const std::string text(v.text);
      if (std::string_view(name) == "VRAM_BACKEND") configure({{name, text.c_str()}});
      else configure({{"VRAM_BACKEND", "host"}, {name, text.c_str()}});
      INFO(name << " = " << vram::quoted(text) << " (" << v.what << ")");
      CHECK(a.init(0) == -1);
      const std::string why = a.last_error();
      INFO(why);
      CHECK(why.find(std::string("bad ") + name + " " + vram::quoted(text) + ": ") != std::string::npos);
      CHECK(why.find('\n') == std::string::npos);
      CHECK(a.malloc_(256, 0, nullptr) == nullptr);
    }
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_DEVICE_COUNT", "64"}, {"VRAM_POOL_MAX", "1.5GiB"}});
  CHECK(a.init(63) == 0);  // the edges are values
}

TEST_CASE("C ABI: every name variable refuses a control character, naming itself and the text as given",
          "[interop][c_abi]") {
  // The environment carries no NUL; every other control character is refused. Blanks, dots
  // and UTF-8 are names (a tenant called "team a" is one).
  const char* hostile[] = {"a\tb", "\tjob", "job\n", "a\x1b[2Jb", "a\x7f", "\r"};
  const std::pair<const char*, const char*> variables[] = {
      {"VRAM_TENANT", nullptr}, {"VRAM_EVENT_LOG", nullptr}, {"VRAM_LEDGER", "VRAM_LEDGER_TENANT"},
      {"VRAM_LEDGER_TENANT", "VRAM_LEDGER"}};
  auto& a = lib();
  for (auto [name, partner] : variables)
    for (const char* text : hostile) {
      if (partner != nullptr) configure({{"VRAM_BACKEND", "host"}, {name, text}, {partner, "ok"}});
      else configure({{"VRAM_BACKEND", "host"}, {name, text}});
      INFO(name << " = " << vram::quoted(text));
      CHECK(a.init(0) == -1);
      const std::string why = a.last_error();
      INFO(why);
      CHECK(why.find(std::string("bad ") + name + " " + vram::quoted(text) + ": a name or path without control characters") !=
            std::string::npos);
      CHECK(a.malloc_(256, 0, nullptr) == nullptr);
    }
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_TENANT", "team a/\xc3\xa9"}});
  CHECK(a.init(0) == 0);  // a blank, a slash and UTF-8 are a name
}

TEST_CASE("C ABI: an out of memory names the variable that set the cap which refused it", "[interop][c_abi]") {
  auto& a = lib();
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_POOL_MAX", "4M"}, {"VRAM_POOL_STEP", "2M"}});
  CHECK(a.malloc_(std::size_t{8} << 20, 0, nullptr) == nullptr);
  CHECK(std::string(a.last_error()).find("\nthe pool's cap is VRAM_POOL_MAX=4M") != std::string::npos);
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_TENANT", "job"}, {"VRAM_TENANT_QUOTA", "1M"}});
  CHECK(a.malloc_(std::size_t{2} << 20, 0, nullptr) == nullptr);
  CHECK(std::string(a.last_error()).find("\nthe tenant's hard limit is VRAM_TENANT_QUOTA=1M") != std::string::npos);
  configure({{"VRAM_BACKEND", "simulated"}, {"VRAM_DEVICE_BUDGET", "64M"}, {"VRAM_POOL_STEP", "2M"}});
  CHECK(a.malloc_(std::size_t{96} << 20, 0, nullptr) == nullptr);
  CHECK(std::string(a.last_error()).find("\nthe simulated device's capacity is VRAM_DEVICE_BUDGET=64M") !=
        std::string::npos);
  configure({{"VRAM_BACKEND", "simulated"}, {"VRAM_DEVICE_BUDGET", "1G"}});
  REQUIRE(a.set_memory_fraction(0.25, 0) == 0);
  CHECK(a.malloc_(std::size_t{300} << 20, 0, nullptr) == nullptr);
  CHECK(std::string(a.last_error()).find("cap of 268435456 bytes") != std::string::npos);
}

TEST_CASE("C ABI: tenant quotas and a snapshot of who holds memory", "[interop][c_abi]") {
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_TENANT", "trainer"}, {"VRAM_TENANT_QUOTA", "1M"}});
  auto& a = lib();
  void* p = a.malloc_(std::size_t{600} << 10, 0, nullptr);  // charged to "trainer"
  REQUIRE(p != nullptr);
  CHECK(a.tenant_usage("trainer", 0) >= std::size_t{600} << 10);
  CHECK(a.malloc_(std::size_t{600} << 10, 0, nullptr) == nullptr);  // over trainer's 1 MiB
  CHECK(std::string(a.last_error()).find("trainer") != std::string::npos);
  CHECK(std::string(a.last_error()).find("cause: tenant 'trainer'") != std::string::npos);  // explain()
  CHECK(std::string(a.last_error()).find("\nheld by: tenant 'trainer' 600.00 KiB.") != std::string::npos);

  REQUIRE(a.set_tenant("eval") == 0);  // this thread now allocates for "eval"
  REQUIRE(a.set_tenant_quota("eval", std::size_t{64} << 10, 0) == 0);
  void* q = a.malloc_(std::size_t{32} << 10, 0, nullptr);
  REQUIRE(q != nullptr);
  CHECK(a.tenant_usage("eval", 0) >= std::size_t{32} << 10);
  CHECK(a.malloc_(std::size_t{64} << 10, 0, nullptr) == nullptr);
  std::thread([&] {  // other threads still use the configured tenant
    void* r = a.malloc_(std::size_t{100} << 10, 0, nullptr);
    CHECK(r != nullptr);
    a.free_(r, std::size_t{100} << 10, 0, nullptr);
  }).join();

  std::string json = snapshot_text("vram_c_abi_test.json");
  CHECK(json.find("trainer") != std::string::npos);
  CHECK(json.find("eval") != std::string::npos);

  a.free_(p, std::size_t{600} << 10, 0, nullptr);
  a.free_(q, std::size_t{32} << 10, 0, nullptr);
  CHECK(a.tenant_usage("trainer", 0) == 0);
  CHECK(a.tenant_usage("eval", 0) == 0);
  CHECK(a.set_tenant(nullptr) == 0);
}

TEST_CASE("C ABI: many threads allocate and free concurrently", "[interop][c_abi]") {
  configure({{"VRAM_BACKEND", "host"}});
  auto& a = lib();
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < 2000; ++i) {
        std::size_t n = 256 + std::size_t((i * 7919 + t * 104729) % 50000);
        void* p = a.malloc_(n, 0, nullptr);
        if (p == nullptr) {
          ++bad;
          continue;
        }
        static_cast<char*>(p)[0] = static_cast<char>(t);
        mine.emplace_back(p, n);
        if (i % 3 == 0) {
          auto [q, m] = mine.back();
          if (static_cast<char*>(q)[0] != static_cast<char>(t)) ++bad;
          a.free_(q, m, 0, nullptr);
          mine.pop_back();
        }
      }
      for (auto [q, m] : mine) a.cupy_free(nullptr, q, 0);
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
  CHECK(stats_of(0).live_allocations == 0);
}

TEST_CASE("C ABI: VRAM_EVENT_LOG writes every event of a device, with its tenant, as an RMM log", "[interop][c_abi]") {
  std::string pattern = "/tmp/vram-c-abi-events-" + std::to_string(::getpid()) + "-%d.csv";
  std::string path = pattern.substr(0, pattern.size() - 6) + "2.csv";  // device 2
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_EVENT_LOG", pattern.c_str()}});
  auto& a = lib();
  REQUIRE(a.set_tenant("eval") == 0);
  for (int i = 0; i < 100; ++i) {
    void* p = a.malloc_(std::size_t{4096} << (i % 8), 2, nullptr);
    REQUIRE(p != nullptr);
    a.free_(p, std::size_t{4096} << (i % 8), 2, nullptr);
  }
  REQUIRE(a.set_tenant(nullptr) == 0);
  a.shutdown();  // writes the log out
  vram::trace::trace t = vram::trace::read_trace(path);
  CHECK(t.format == "rmm-csv");
  CHECK(t.allocs() == 100);
  CHECK(t.frees() == 100);
  REQUIRE(t.tenants.size() == 2);
  CHECK(t.tenants[1] == "eval");
  std::remove(path.c_str());
  // A process that exits without vram_shutdown (as a framework does) still writes its log.
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_EVENT_LOG", pattern.c_str()}});
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    for (int i = 0; i < 10; ++i) {
      void* p = a.malloc_(4096, 2, nullptr);
      if (p == nullptr) std::_Exit(1);
      a.free_(p, 4096, 2, nullptr);
    }
    std::exit(0);  // the exit handlers, not vram_shutdown
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(vram::trace::read_trace(path).allocs() == 10);
  std::remove(path.c_str());
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_EVENT_LOG", "/nonexistent-dir/events.csv"}});
  CHECK(a.init(0) == -1);
  CHECK(std::string(a.last_error()).find("/nonexistent-dir/events.csv") != std::string::npos);
}

TEST_CASE("C ABI: two variables join a quota ledger, which charges what the pool holds", "[interop][c_abi]") {
  vram::test::scratch_ledger ledger({}, "-gpu1");  // what vram-quota create + set would make
  vram::tenant llama = ledger.admin().add_tenant("serving/llama");
  vram::tenant serving = ledger.admin().at("serving");
  ledger.admin().set_hard_limit(serving, std::size_t{4} << 20);
  std::string name = ledger.name();
  std::string pattern = name.substr(0, name.size() - 1) + "%d";  // "%d": the device id
  const int device = 1;
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_POOL_STEP", "1M"}, {"VRAM_LEDGER", pattern.c_str()},
             {"VRAM_LEDGER_TENANT", "serving/llama"}});
  auto& a = lib();
  void* p = a.malloc_(std::size_t{1} << 20, device, nullptr);
  REQUIRE(p != nullptr);
  CHECK(ledger.admin().usage(llama) == stats_of(device).reserved_bytes);  // the pool's chunks, not the request
  CHECK(ledger.admin().usage(serving) >= std::size_t{1} << 20);
  REQUIRE(ledger.admin().processes().size() == 1);
  CHECK(ledger.admin().processes()[0].alive);

  CHECK(a.malloc_(std::size_t{4} << 20, device, nullptr) == nullptr);  // serving's 4 MiB
  std::string why = a.last_error();
  INFO(why);
  CHECK(why.find("quota ledger") != std::string::npos);
  CHECK(why.find("'serving'") != std::string::npos);
  CHECK(ledger.admin().usage(serving) <= std::size_t{4} << 20);

  a.free_(p, std::size_t{1} << 20, device, nullptr);
  CHECK(ledger.admin().usage(llama) == stats_of(device).reserved_bytes);  // cached: still the process's
  a.empty_cache();
  CHECK(ledger.admin().usage(llama) == 0);
  a.shutdown();
  CHECK(ledger.admin().processes().empty());  // the slot went with the allocator

  configure({{"VRAM_BACKEND", "host"}, {"VRAM_LEDGER", name.c_str()}, {"VRAM_LEDGER_TENANT", "serving/nobody"}});
  CHECK(a.init(0) == -1);
  CHECK(std::string(a.last_error()).find("serving/nobody") != std::string::npos);
  configure({{"VRAM_BACKEND", "host"}, {"VRAM_LEDGER", name.c_str()}});
  CHECK(a.init(0) == -1);
  CHECK(std::string(a.last_error()).find("VRAM_LEDGER_TENANT") != std::string::npos);
}

TEST_CASE("C ABI: step marks find a tenant whose memory grows every step", "[interop][c_abi]") {
  configure({{"VRAM_BACKEND", "host"}});
  auto& a = lib();
  std::vector<void*> kept;
  REQUIRE(a.set_tenant("leaky") == 0);
  int leaks = 0;
  for (int step = 0; step < 12; ++step) {
    void* scratch = a.malloc_(std::size_t{4} << 20, 0, nullptr);  // freed within the step
    REQUIRE(scratch != nullptr);
    kept.push_back(a.malloc_(std::size_t{512} << 10, 0, nullptr));  // never freed
    a.free_(scratch, std::size_t{4} << 20, 0, nullptr);
    leaks = a.mark_step();
    REQUIRE(leaks >= 0);
    if (step < 7) CHECK(leaks == 0);  // not yet 8 marks of growth
  }
  CHECK(leaks >= 1);
  CHECK(snapshot_text("vram_c_abi_steps.txt").find("suspected leak: tenant 'leaky'") != std::string::npos);
  for (void* p : kept) a.free_(p, std::size_t{512} << 10, 0, nullptr);
  a.set_tenant(nullptr);
}
