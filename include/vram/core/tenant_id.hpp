#pragma once
// vram::tenant: the id of a tenant (a job, model or request class whose memory is counted
// apart). Names and parents live in vram::tenant_registry (tenant.hpp); the id alone is what
// counters, quota errors and scopes carry.

#include <cstdint>

namespace vram {

/// A tenant id. Cheap to copy; meaningful with the registry that created it.
struct tenant {
  std::uint32_t id = 0;

  /// The default tenant: allocations made outside any tenant_scope.
  [[nodiscard]] static constexpr tenant none() noexcept { return tenant{}; }
  friend constexpr bool operator==(tenant, tenant) noexcept = default;
};

}  // namespace vram
