#pragma once
// vram::quota_exceeded: the out_of_memory a quota_adaptor throws when a hard limit would be
// exceeded. It names the tenant whose limit was hit, the limit, its usage and the request.

#include <cstddef>
#include <cstdio>

#include <vram/core/error.hpp>
#include <vram/core/tenant.hpp>

namespace vram {

/// Thrown before the upstream is touched: granting `bytes` to `requester` would take
/// `limited` (the requester or one of its ancestors) past its hard limit. Allocates nothing.
class quota_exceeded : public out_of_memory {
 public:
  /// `resource` and `tenant_name` must outlive the exception (literals, registry names).
  quota_exceeded(const char* resource, std::size_t bytes, stream_ref stream, tenant requester, tenant limited,
                 const char* tenant_name, std::size_t limit, std::size_t usage) noexcept
      : out_of_memory(resource, bytes, stream),
        requester_(requester),
        limited_(limited),
        tenant_name_(tenant_name),
        limit_(limit),
        usage_(usage) {
    std::snprintf(message_, sizeof message_,
                  "vram: out of memory (quota exceeded) in %s: tenant '%s' (id %u) uses %zu of its %zu byte limit; %zu bytes "
                  "requested by tenant id %u",
                  resource, tenant_name, limited.id, usage, limit, bytes, requester.id);
  }

  /// The tenant the request was made for.
  [[nodiscard]] tenant requester() const noexcept { return requester_; }
  /// The tenant whose hard limit refused it (the requester or an ancestor).
  [[nodiscard]] tenant limited_tenant() const noexcept { return limited_; }
  [[nodiscard]] const char* tenant_name() const noexcept { return tenant_name_; }
  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }
  /// The limited tenant's usage when the request was refused (without the request).
  [[nodiscard]] std::size_t usage() const noexcept { return usage_; }

 private:
  tenant requester_;
  tenant limited_;
  const char* tenant_name_;
  std::size_t limit_;
  std::size_t usage_;
};

}  // namespace vram
