// Two pieces of work, the second needing all of the first, in one parallel region.
//
// Every parallel region costs its threads a start and an end barrier, and libgomp's
// barriers end in a futex call: in a virtual machine ~2-4 us a region, which a decode
// step pays some 300 times. A LoRA adapter's update of a projection is a region of its
// own after the base projection's (120 more a step at every projection of 30 layers);
// run in the same region, behind a barrier, it pays for one barrier, not two.
#pragma once

#include <ATen/Parallel.h>
#include <omp.h>

#include <cstdint>

// first(thread, threads) on every thread of a region, then, once every thread has
// finished its share of it, second(thread, threads). One thread runs both in turn
// where torch has one thread or this is called inside a parallel region.
template <typename First, typename Second>
void in_one_region(const First& first, const Second& second) {
  const int threads = at::get_num_threads();
  if (threads == 1 || at::in_parallel_region()) {
    first(0, 1);
    second(0, 1);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t thread = omp_get_thread_num(), count = omp_get_num_threads();
    first(thread, count);
#pragma omp barrier
    second(thread, count);
  }
}
