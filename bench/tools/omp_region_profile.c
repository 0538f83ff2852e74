// SPDX-License-Identifier: Apache-2.0
// Where a multi-threaded step's time goes between and inside its OpenMP parallel regions (GCC's
// libgomp): an LD_PRELOAD shim that wraps GOMP_parallel and, per outlined region body (its code
// address), sums the region's wall time, the busiest and the idlest thread's time inside the body
// (their difference is time a thread spun at the region's end barrier), and the time the calling
// thread spent alone since the previous region ended (the other threads spun waiting for work).
// At exit it prints one line per region body, the largest first, with the body's offset in its
// object: resolve it with `addr2line -f -C -e BINARY OFFSET`, or `nm -C BINARY | grep ...`.
// bench/RESULTS.md, "Binary Huffman HS against fastText's own C++" (stop 41).
//
// gcc -O2 -shared -fPIC bench/tools/omp_region_profile.c -o /tmp/omp_region_profile.so -ldl
// LD_PRELOAD=/tmp/omp_region_profile.so OMP_NUM_THREADS=2 OMP_WAIT_POLICY=active /tmp/hs_omp_step o 2000
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { max_bodies = 256, max_threads = 64 };

typedef struct {
  void (*body)(void*);
  long calls;
  double wall, busiest, idlest, alone_before;
} region_stats;

static region_stats stats[max_bodies];
static int bodies;
static double last_end;  // when the previous region returned to the calling thread
static double first_start, total_alone;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

typedef struct {
  void (*body)(void*);
  void* data;
  double busy[max_threads];
} wrapped_call;

extern int omp_get_thread_num(void);

static void timed_body(void* p) {
  wrapped_call* w = p;
  double t0 = now();
  w->body(w->data);
  int t = omp_get_thread_num();
  if (t < max_threads) w->busy[t] = now() - t0;
}

static region_stats* stats_of(void (*body)(void*)) {
  for (int i = 0; i < bodies; ++i)
    if (stats[i].body == body) return &stats[i];
  if (bodies == max_bodies) return NULL;
  stats[bodies].body = body;
  return &stats[bodies++];
}

typedef void (*gomp_parallel_t)(void (*)(void*), void*, unsigned, unsigned);

void GOMP_parallel(void (*body)(void*), void* data, unsigned threads, unsigned flags) {
  static gomp_parallel_t real;
  if (!real) real = (gomp_parallel_t)dlsym(RTLD_NEXT, "GOMP_parallel");
  wrapped_call w;
  memset(&w, 0, sizeof w);
  w.body = body;
  w.data = data;
  double start = now();
  if (first_start == 0) first_start = start;
  real(timed_body, &w, threads, flags);
  double end = now();
  region_stats* s = stats_of(body);
  if (!s) return;
  unsigned team = threads == 0 || threads > max_threads ? max_threads : threads;
  double hi = 0, lo = 1e30;
  for (unsigned t = 0; t < team; ++t) {
    if (w.busy[t] == 0) continue;  // a thread the team did not have
    if (w.busy[t] > hi) hi = w.busy[t];
    if (w.busy[t] < lo) lo = w.busy[t];
  }
  s->calls += 1;
  s->wall += end - start;
  s->busiest += hi;
  s->idlest += lo == 1e30 ? 0 : lo;
  if (last_end != 0) {
    s->alone_before += start - last_end;
    total_alone += start - last_end;
  }
  last_end = end;
}

static int by_wall(const void* a, const void* b) {
  double x = ((const region_stats*)a)->wall + ((const region_stats*)a)->alone_before;
  double y = ((const region_stats*)b)->wall + ((const region_stats*)b)->alone_before;
  return (x < y) - (x > y);
}

__attribute__((destructor)) static void report(void) {
  qsort(stats, bodies, sizeof stats[0], by_wall);
  double span = last_end - first_start, wall = 0;
  for (int i = 0; i < bodies; ++i) wall += stats[i].wall;
  fprintf(stderr, "omp_region_profile: %.3f s from the first region's start to the last's end: %.1f %% in regions, "
          "%.1f %% on the calling thread alone between them\n", span, 100 * wall / span, 100 * total_alone / span);
  fprintf(stderr, "%8s %10s %10s %10s %10s %10s  %s\n", "calls", "wall us", "busiest", "idlest", "end spin", "alone bef",
          "body (object+offset)");
  for (int i = 0; i < bodies; ++i) {
    region_stats* s = &stats[i];
    Dl_info info;
    const char* object = "?";
    unsigned long offset = (unsigned long)s->body;
    if (dladdr((void*)s->body, &info) && info.dli_fname) {
      object = strrchr(info.dli_fname, '/') ? strrchr(info.dli_fname, '/') + 1 : info.dli_fname;
      offset = (unsigned long)s->body - (unsigned long)info.dli_fbase;
    }
    double per = 1e6 / s->calls;
    fprintf(stderr, "%8ld %10.2f %10.2f %10.2f %10.2f %10.2f  %s+0x%lx\n", s->calls, s->wall * per, s->busiest * per,
            s->idlest * per, (s->busiest - s->idlest) * per, s->alone_before * per, object, offset);
  }
}
