#pragma once
// What a quota book answers when asked for more bytes (quota_book.hpp, quota_ledger.hpp).

#include <cstddef>
#include <cstdint>

#include <vram/core/tenant_id.hpp>

namespace vram::detail::adaptor {

/// Granted (with the levels whose soft limit the charge crossed upward), or refused by
/// `limited`, whose hard limit is `limit` and usage, without the request, `usage`.
struct charge_result {
  bool granted;
  std::uint64_t soft_crossed;  // bit i: level i (0 = the tenant, 1 = its parent, ...)
  tenant limited;
  std::size_t limit;
  std::size_t usage;
};

}  // namespace vram::detail::adaptor
