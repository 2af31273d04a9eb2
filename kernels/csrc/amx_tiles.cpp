// AMX's tiles: whether this process may use them, and whether it wants to (amx_tiles.h).

#include "amx_tiles.h"

#include <atomic>

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
#define AMX_TILES_BUILT 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

std::atomic<bool> wanted{true};

#if defined(AMX_TILES_BUILT)
// Linux hands the tiles' 8 KB of state only to a process that asks for it
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); without it the first tile
// instruction faults. Asked once, on first use; where it is refused the kernels run
// their AVX-512 code instead.
bool ask_for_tiles() {
  constexpr int kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long features = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &features) != 0) return false;
  return ((features >> kXfeatureXtiledata) & 1) != 0;
}
#endif

}  // namespace

bool amx_tiles_available() {
#if defined(AMX_TILES_BUILT)
  static const bool granted = ask_for_tiles();
  return granted;
#else
  return false;
#endif
}

bool set_amx_tiles(bool enabled) { return wanted.exchange(enabled); }

bool amx_tiles::ready() { return wanted.load(std::memory_order_relaxed) && amx_tiles_available(); }
