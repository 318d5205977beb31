#pragma once
// Throw helpers of the adaptor layer (STYLE rule 7: throws go through one detail function).

#include <cstddef>

#include <vram/adaptor/quota_exceeded.hpp>

namespace vram::detail {

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_quota_exceeded(const char* resource, std::size_t bytes,
                                                                      stream_ref stream, tenant requester,
                                                                      tenant limited, const char* tenant_name,
                                                                      std::size_t limit, std::size_t usage) {
  throw quota_exceeded(resource, bytes, stream, requester, limited, tenant_name, limit, usage);
}

}  // namespace vram::detail
