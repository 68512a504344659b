// Threads of a Hopper warpgroup (4 warps). Plain C++: the host's launch geometry includes it too.
#pragma once

namespace flashjit {
constexpr int kWarpgroupThreads = 128;
}
