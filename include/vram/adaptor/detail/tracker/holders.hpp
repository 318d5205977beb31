#pragma once
// detail::tracker::top_holders: the tenants and tags that hold the most live bytes, copied
// into the fixed arrays an out_of_memory carries (vram::memory_holders), so the exception
// names who held the memory without referring to the tracker's records or its registry.

#include <cstddef>
#include <vector>

#include <vram/adaptor/tracker_snapshot.hpp>
#include <vram/core/error.hpp>

namespace vram::detail::tracker {

/// The first memory_holders::max_listed entries of `by_tenant` and `by_tag` (each already in
/// descending bytes, as tracker_snapshot holds them), and how many there were.
[[nodiscard]] inline memory_holders top_holders(const std::vector<tracker_holder>& by_tenant,
                                                const std::vector<tracker_holder>& by_tag) noexcept {
  memory_holders h;
  auto copy = [](const std::vector<tracker_holder>& from, auto& into, std::size_t& listed, std::size_t& total) {
    total = from.size();
    for (const tracker_holder& x : from) {
      if (listed == memory_holders::max_listed) break;
      into[listed].set_name(x.name);
      into[listed++].bytes = x.bytes;
    }
  };
  copy(by_tenant, h.tenant, h.tenants, h.total_tenants);
  copy(by_tag, h.tag, h.tags, h.total_tags);
  return h;
}

}  // namespace vram::detail::tracker
