#pragma once
// The throw functions live in core (vram/core/throw.hpp); this name forwards there for the
// headers that still include it (alloc/planned_pool.hpp).

#include <vram/core/throw.hpp>
