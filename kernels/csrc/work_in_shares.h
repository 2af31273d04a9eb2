// A kernel's work taken apart into shares, one for each thread, so that two pieces of
// work, the second needing all of the first, can run in one parallel region.
//
// Every parallel region costs its threads a start and an end barrier, and libgomp's
// barriers end in a futex call: in a virtual machine ~2-4 us a region, which a decode
// step pays some 300 times. A LoRA adapter's update of a projection is a region of its
// own after the base projection's (120 more a step at every projection of 30 layers);
// run in the same region, behind a barrier, it pays for one barrier, not two.
//
// A work (PackedLinearWork, QuantizedLinearWork, LoRAWork) is made once, its checks
// and output included, and then has
//   int64_t useful_shares() const;   // how many threads it is worth (at least 1)
//   void run_share(int64_t share, int64_t shares) const;  // share `share` of `shares`
// where the shares of any count together do all of it, each on any thread.
#pragma once

#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <utility>

// Share `share` of `shares` of items 0 .. items - 1, as at::parallel_for splits a range:
// runs of ceil(items / shares), the last ones shorter or empty.
inline std::pair<int64_t, int64_t> even_share(int64_t items, int64_t share, int64_t shares) {
  const int64_t chunk = (items + shares - 1) / shares;
  const int64_t begin = std::min(items, share * chunk);
  return {begin, std::min(items, begin + chunk)};
}

// All of `work`, a share per thread (one thread, with no region, where one is all it is
// worth: as at::parallel_for runs a range of one task).
template <typename Work>
void run_in_shares(const Work& work) {
  const int64_t shares = work.useful_shares();
  at::parallel_for(0, shares, 1, [&](int64_t begin, int64_t end) {
    for (int64_t share = begin; share < end; ++share) work.run_share(share, shares);
  });
}

// All of `first`, then, once every thread has finished its share of it, all of
// `second`, in one parallel region of as many threads as either is worth. One thread
// runs both in turn, with no region, where one is all they are worth, torch has one
// thread, or this is called inside a region.
template <typename First, typename Second>
void in_one_region(const First& first, const Second& second) {
  const int64_t wanted = std::max(first.useful_shares(), second.useful_shares());
  const int threads = static_cast<int>(std::min<int64_t>(wanted, at::get_num_threads()));
  if (threads <= 1 || at::in_parallel_region()) {
    first.run_share(0, 1);
    second.run_share(0, 1);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t share = omp_get_thread_num(), shares = omp_get_num_threads();
    first.run_share(share, shares);
#pragma omp barrier
    second.run_share(share, shares);
  }
}
