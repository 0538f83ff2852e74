// SPDX-License-Identifier: Apache-2.0
// The doctest runner of the CUDA tests (tests/cuda/*_test.cu). Without a usable CUDA device it
// prints why and exits with 77, which CTest reports as "skipped" (SKIP_RETURN_CODE 77).
//
// On a crash (SIGSEGV, SIGILL, SIGBUS, SIGFPE) it prints the faulting address, the instruction
// pointer and the code addresses found on the stack (a scan, not an unwind: -O3 code keeps no frame
// pointers), each as object + offset; `addr2line -Cfe xsoftmax_cuda_tests 0x<offset>` on the
// unstripped build names this executable's (the GPU machine may run a stripped copy, see
// bench/cuda/gpu_run.sh carry). doctest's own signal handling is off for that (it would run first
// and hide the fault's context); the case that crashed is the one doctest last started.
#define DOCTEST_CONFIG_NO_POSIX_SIGNALS
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

/// The executable address ranges of the process (r-x mappings of /proc/self/maps).
struct code_ranges {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  code_ranges() {
    if (FILE* f = std::fopen("/proc/self/maps", "r")) {
      char line[512];
      while (std::fgets(line, sizeof line, f)) {
        unsigned long lo = 0, hi = 0;
        char perms[8] = {};
        if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && perms[2] == 'x') ranges.emplace_back(lo, hi);
      }
      std::fclose(f);
    }
  }
  [[nodiscard]] bool contains(std::uintptr_t a) const {
    for (const auto& r : ranges)
      if (a >= r.first && a < r.second) return true;
    return false;
  }
};

void print_location(const char* what, std::uintptr_t a) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(a), &info) && info.dli_fname) {
    const char* slash = std::strrchr(info.dli_fname, '/');
    std::fprintf(stderr, "  %s %s+0x%lx%s%s\n", what, slash ? slash + 1 : info.dli_fname,
                 static_cast<unsigned long>(a - reinterpret_cast<std::uintptr_t>(info.dli_fbase)),
                 info.dli_sname ? " " : "", info.dli_sname ? info.dli_sname : "");
  } else {
    std::fprintf(stderr, "  %s 0x%lx\n", what, static_cast<unsigned long>(a));
  }
}

const char* current_test_name() {
  const doctest::ContextOptions* o = doctest::getContextOptions();
  return o && o->currentTest ? o->currentTest->m_name : "?";
}

void report_crash(int sig, siginfo_t* info, void* context) {
  const auto* uc = static_cast<const ucontext_t*>(context);
  const auto ip = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  const auto sp = static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]);
  std::fprintf(stderr, "xsoftmax_cuda_tests: CRASHED: signal %d (%s), fault address %p, in test case %s\n", sig,
               strsignal(sig), info->si_addr, current_test_name());
  print_location("ip", ip);
  const code_ranges code;
  const auto* stack = reinterpret_cast<const std::uintptr_t*>(sp);
  int shown = 0;
  for (int i = 0; i < 4096 && shown < 40; ++i)
    if (code.contains(stack[i])) {
      char label[32];
      std::snprintf(label, sizeof label, "sp+%d:", i * 8);
      print_location(label, stack[i]);
      ++shown;
    }
  std::fflush(stderr);
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_crash_report() {
  static char alt_stack[1 << 16];  // so that a stack overflow is reported too
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  sigaltstack(&ss, nullptr);
  for (int sig : {SIGSEGV, SIGILL, SIGBUS, SIGFPE}) {
    struct sigaction sa {};
    sa.sa_sigaction = report_crash;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  // Listing runs no test: it works without a GPU (CI prints what the GPU run would execute).
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0 || std::strncmp(argv[i], "-l", 2) == 0) return context.run();
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("xsoftmax_cuda_tests: no usable CUDA device (%s); skipping the GPU tests\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "device count is 0");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    std::printf("xsoftmax_cuda_tests: running on %s (sm_%d%d, %.1f GiB, concurrentManagedAccess %d, "
                "pageableMemoryAccess %d)\n",
                prop.name, prop.major, prop.minor, static_cast<double>(prop.totalGlobalMem) / (1 << 30),
                prop.concurrentManagedAccess, prop.pageableMemoryAccess);
  install_crash_report();
  return context.run();
}
