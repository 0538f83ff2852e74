// SPDX-License-Identifier: Apache-2.0
// Counts the OpenMP parallel regions a program opens (GCC's libgomp: every `#pragma omp parallel`,
// hence every Thrust omp algorithm, calls GOMP_parallel): an LD_PRELOAD shim that wraps it and
// prints the count at exit. bench/RESULTS.md, "Binary Huffman HS against fastText's own C++":
// regions per hierarchical-softmax step = (count at S2 steps - count at S1 steps) / (S2 - S1).
//
// gcc -O2 -shared -fPIC bench/tools/omp_region_count.c -o /tmp/omp_region_count.so -ldl
// LD_PRELOAD=/tmp/omp_region_count.so OMP_NUM_THREADS=1 /tmp/hs_omp_step o 10   # then 20
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
static long count;
typedef void (*fn_t)(void (*)(void*), void*, unsigned, unsigned);
void GOMP_parallel(void (*f)(void*), void* d, unsigned n, unsigned flags) {
  static fn_t real; if (!real) real = (fn_t)dlsym(RTLD_NEXT, "GOMP_parallel");
  ++count; real(f, d, n, flags);
}
__attribute__((destructor)) static void report(void) { fprintf(stderr, "GOMP_parallel calls: %ld\n", count); }
