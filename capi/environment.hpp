#pragma once
// The C ABI's environment: the VRAM_* variables read, strictly, into a config (docs/errors.md
// has each grammar). A room of vram_c_abi.cpp, included by it alone.

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include <vram/core/bytes.hpp>
#include <vram/core/names.hpp>
#include <vram/core/parse.hpp>
#include <vram/core/throw.hpp>
#if VRAM_HAS_CUDA
#  include <cuda_runtime_api.h>
#endif

namespace {

using namespace vram;

constexpr int max_devices = 64;

// ---- configuration ------------------------------------------------------------------------

enum class backend_kind { host, simulated, cuda };
enum class allocator_kind { pool, slab, direct };

struct config {
  backend_kind backend = backend_kind::host;
  allocator_kind allocator = allocator_kind::pool;
  bool plan = false;              // VRAM_PLAN=1: the pool is a planned_pool, driven by vram_mark_step
  std::size_t pool_initial = 0;
  std::size_t pool_max = 0;
  std::size_t pool_step = 0;
  std::size_t device_budget = 0;  // slab budget; simulated capacity
  std::string tenant_name;        // empty: the default tenant
  std::size_t tenant_quota = 0;   // 0: none
  std::string ledger;             // quota ledger name ("%d": the device id); empty: none
  std::string ledger_tenant;      // the tenant path this process charges in it
  std::string event_log;          // the tracker's event log ("%d": the device id); empty: none
  int device_count = 8;           // host / simulated
  // The caps as the environment gave them, for the out-of-memory they cause; empty: unset.
  std::string pool_max_text, device_budget_text, tenant_quota_text;
};

/// The value of `name`; null when it is unset. Set and empty is a value (refused where a
/// number or a choice is meant).
const char* env(const char* name) noexcept { return std::getenv(name); }

[[noreturn]] void refuse(const char* name, const char* text, const char* expected) {
  detail::throw_invalid_argument("vram_c", refusal(name, text, expected).c_str());
}

/// A name, a path or a file: empty is the same as unset; a control character is refused.
const char* env_name(const char* name) {
  const char* v = env(name);
  if (v == nullptr || *v == '\0') return nullptr;
  if (detail::has_control_character(v)) refuse(name, v, "a name or path without control characters");
  return v;
}

/// A size (vram::parse_bytes), kept in `bytes` and as given in `text`; unchanged when unset.
void env_size(const char* name, std::size_t& bytes, std::string* text = nullptr) {
  const char* v = env(name);
  if (v == nullptr) return;
  std::optional<std::size_t> b = parse_bytes(v);
  if (!b) refuse(name, v, size_grammar);
  bytes = *b;
  if (text != nullptr) *text = v;
}

/// The index of the value of `name` among `choices`; -1 when it is unset.
template <std::size_t N>
int env_choice(const char* name, const std::array<const char*, N>& choices, const char* expected) {
  const char* v = env(name);
  if (v == nullptr) return -1;
  for (std::size_t i = 0; i < N; ++i)
    if (std::strcmp(v, choices[i]) == 0) return static_cast<int>(i);
  refuse(name, v, expected);
}

bool cuda_usable() noexcept {
#if VRAM_HAS_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
#else
  return false;
#endif
}

config read_config() {
  config c;
  c.backend = cuda_usable() ? backend_kind::cuda : backend_kind::host;
  switch (env_choice("VRAM_BACKEND", std::array{"host", "simulated", "cuda"}, "cuda, simulated or host")) {
    case 0: c.backend = backend_kind::host; break;
    case 1: c.backend = backend_kind::simulated; break;
    case 2:
      if (!cuda_usable()) detail::throw_invalid_argument("vram_c", "VRAM_BACKEND=cuda but no usable CUDA device");
      c.backend = backend_kind::cuda;
      break;
    default: break;
  }
  switch (env_choice("VRAM_ALLOCATOR", std::array{"pool", "slab", "direct"}, "pool, slab or direct")) {
    case 0: c.allocator = allocator_kind::pool; break;
    case 1: c.allocator = allocator_kind::slab; break;
    case 2: c.allocator = allocator_kind::direct; break;
    default: break;
  }
  env_size("VRAM_POOL_INITIAL", c.pool_initial);
  env_size("VRAM_POOL_MAX", c.pool_max, &c.pool_max_text);
  env_size("VRAM_POOL_STEP", c.pool_step);
  env_size("VRAM_DEVICE_BUDGET", c.device_budget, &c.device_budget_text);
  if (const char* v = env_name("VRAM_TENANT")) c.tenant_name = v;
  env_size("VRAM_TENANT_QUOTA", c.tenant_quota, &c.tenant_quota_text);
  if (const char* v = env("VRAM_DEVICE_COUNT")) {
    std::optional<std::uint64_t> n = parse_count(v);
    if (!n || *n < 1 || *n > max_devices) refuse("VRAM_DEVICE_COUNT", v, "a whole decimal number of devices, 1 to 64");
    c.device_count = static_cast<int>(*n);
  }
  if (const char* v = env_name("VRAM_EVENT_LOG")) c.event_log = v;
  if (const char* v = env_name("VRAM_LEDGER")) c.ledger = v;
  if (const char* v = env_name("VRAM_LEDGER_TENANT")) c.ledger_tenant = v;
  if (c.ledger.empty() != c.ledger_tenant.empty())
    detail::throw_invalid_argument("vram_c", "VRAM_LEDGER and VRAM_LEDGER_TENANT go together");
  c.plan = env_choice("VRAM_PLAN", std::array{"0", "1"}, "0 or 1") == 1;
  if (c.plan && c.allocator != allocator_kind::pool)
    detail::throw_invalid_argument("vram_c", "VRAM_PLAN=1 plans the pool: it needs VRAM_ALLOCATOR=pool");
  if (c.allocator == allocator_kind::slab && c.device_budget == 0)
    detail::throw_invalid_argument("vram_c", "VRAM_ALLOCATOR=slab needs VRAM_DEVICE_BUDGET");
  return c;
}

}  // namespace
